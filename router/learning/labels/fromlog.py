"""The label model from the log: attempts with an explicit outcome teach what the conversation meant.

The router stores, per attempt, its latest inferred label with the features it read
(``details.features``). Where the client also sent an explicit outcome, that pair is a training
sample. `router train` measures the label model in force on them and, given enough, fits a new
one (cross-validated by task, so the figures it prints are out of sample).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from router.features.labels.model import SOURCE, LabelModel
from router.learning.labels import fit as fitting
from router.store import OutcomeRecord

#: Fewer explicit outcomes (or fewer of either kind) than this and no new model is fitted.
MIN_SAMPLES: Final = 50
MIN_PER_CLASS: Final = 10


def samples(outcomes: Iterable[OutcomeRecord]) -> list[fitting.Sample]:
    """One sample per attempt that has both an explicit outcome and a stored label reading."""
    explicit: dict[tuple[str, int], OutcomeRecord] = {}
    inferred: dict[tuple[str, int], dict[str, Any]] = {}  # the label's details
    for o in outcomes:
        key = (o.task_id, o.attempt or 0)
        if o.explicit:
            if key not in explicit or o.ts >= explicit[key].ts:
                explicit[key] = o
        elif o.source == SOURCE and isinstance(o.details, dict):
            inferred[key] = o.details
    out = []
    for key, details in sorted(inferred.items()):
        x = details.get("features")
        verdict = explicit.get(key) or explicit.get((key[0], 0))
        if verdict is not None and isinstance(x, dict):
            out.append(fitting.Sample(key[0], {str(k): float(v) for k, v in x.items()}, verdict.success))
    return out


def train(outcomes: Iterable[OutcomeRecord], current: LabelModel, out: Path | None) -> dict[str, Any]:
    """The current model's quality on the log's explicit outcomes; a refitted one's, written to
    ``out``, when there are enough of them."""
    data = samples(outcomes)
    y = [int(s.success) for s in data]
    report: dict[str, Any] = {
        "explicit_with_label": len(data),
        "current": {"sha256": current.sha256, **fitting.quality([current.p_success(s.x) for s in data], y)},
    }
    if len(data) < MIN_SAMPLES or min(sum(y), len(y) - sum(y)) < MIN_PER_CLASS:
        report["refit"] = None
        report["why_not"] = (
            f"{len(data)} attempts with an explicit outcome and a stored label; a refit needs "
            f"{MIN_SAMPLES}, at least {MIN_PER_CLASS} of each kind"
        )
        return report
    oof = fitting.cross_validate(data, current.features)
    model = fitting.fit(data, current.features, meta={"fitted_on": "log", "attempts": len(data)})
    cv = fitting.quality(list(oof), y)
    refit: dict[str, Any] = {"cv": cv, "not_worth_pinning": not_worth(cv, report["current"])}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(model.to_json())
        refit |= {"path": str(out), "sha256": model.sha256}
    report["refit"] = refit
    return report


def not_worth(cv: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why a refitted model should not be pinned (None: out of fold, it tells resolved attempts from
    failed ones beyond chance and reads them better than the model in force). A small log's refit
    can be noise: a model that cannot tell them apart would stop or escalate attempts at random."""
    auc, n1 = cv.get("auc"), round(cv["n"] * cv["base_rate"])
    if auc is None or auc - 2 * _auc_se(auc, n1, cv["n"] - n1) <= 0.5 or cv["brier"] >= cv["brier_constant"]:
        shown = "n/a" if auc is None else f"{auc:.3f}"
        return (f"out of fold it tells resolved attempts from failed ones no better than chance "
                f"(AUC {shown} on {cv['n']} attempts; Brier {cv['brier']:.4f}, constant {cv['brier_constant']:.4f})")  # fmt: skip
    if current.get("n") and current["brier"] <= cv["brier"]:
        return f"the model in force reads these attempts as well (Brier {current['brier']:.4f} against {cv['brier']:.4f})"
    return None


def _auc_se(auc: float, pos: int, neg: int) -> float:
    """The AUC's standard error (Hanley & McNeil, 1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = auc * (1 - auc) + (pos - 1) * (q1 - auc * auc) + (neg - 1) * (q2 - auc * auc)
    return math.sqrt(max(var, 0.0) / max(pos * neg, 1))


def lines(report: Mapping[str, Any]) -> Sequence[str]:
    """The report as `router train` prints it."""

    def q(d: Mapping[str, Any]) -> str:
        if not d.get("n"):
            return "no attempts to measure on"
        auc = "n/a" if d.get("auc") is None else f"{d['auc']:.3f}"
        return (f"AUC {auc}, Brier {d['brier']:.4f} (constant {d['brier_constant']:.4f}), "
                f"agreement {d['agreement']:.0%} on {d['n']} attempts")  # fmt: skip

    out = [
        f"label model: {report['explicit_with_label']} attempts with an explicit outcome and a stored label",
        f"  in force ({report['current']['sha256'][:12]}…): {q(report['current'])}",
    ]
    refit = report.get("refit")
    if refit is None:
        out.append(f"  not refitted: {report['why_not']}")
    else:
        out.append(f"  refitted, 5-fold CV by task: {q(refit['cv'])}")
        if "path" in refit:
            # The hash on a line of its own (an 80-column terminal broke it after the path), and
            # what to write in the policy, not only under which key.
            out.append(f"  wrote {refit['path']}")
            out.append(f"    sha256 {refit['sha256']}")
            if (why := refit.get("not_worth_pinning")) is not None:
                out.append(f"    not worth pinning: {why}")
            else:
                out.append("    pin it to use it: tasks: {label_model: {artifact: PATH, sha256: SHA256}}")
    return out
