"""`router eval-labels`: how far the outcome label can be trusted, measured on real agent runs.

Every trajectory is replayed through the proxy's path in each shape (``replay``). The label
model is then cross-validated (5 folds grouped by task, seeded): each attempt's P(success) at
every turn comes from a model fitted without its task. Reported per shape, at the last request
and at requests 10/20/30 (what the router knew mid-attempt): coverage (attempts with a
verdict), agreement with the official verdict, AUC, Brier (with the constant predictor's) and
a reliability table; the hand-weighted label the router used before is measured beside it.
``--stop-loss`` cuts each attempt at its first request with P(success) < t and counts, over t,
the dollars not spent (the provider's per-call cost) against the resolved runs lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from router.features.labels.infer import capped
from router.features.labels.model import LabelModel
from router.learning.labels import fit as fitting
from router.learning.labels.replay import SHAPES, Trajectory, replay

CHECKPOINTS: Final = ("last", 10, 20, 30)
#: What is measured: the label model (CV), turns alone (CV), the hand-weighted label it replaces,
#: the shipped model (fitted on these runs: in-sample).
LABELS: Final = ("cv", "steps", "rules", "shipped")
THRESHOLDS: Final = tuple(round(0.3 + 0.05 * i, 2) for i in range(9))


@dataclass(slots=True)
class Attempt:
    """One trajectory replayed in one shape: per request, the features and the labels."""

    trajectory: Trajectory
    x: list[dict[str, float]]
    shipped: list[float]
    rules: list[bool | None]
    cv: list[float] = field(default_factory=list)
    #: The baseline: a model of the number of turns alone (longer runs fail more), cross-validated.
    steps: list[float] = field(default_factory=list)
    #: Per request, whether the agent was in a tool loop (the label caps P there, as live).
    loops: list[bool] = field(default_factory=list)


def replay_all(trajectories: Sequence[Trajectory], shape: str, model: LabelModel) -> list[Attempt]:
    out = []
    for t in trajectories:
        turns = replay(t, shape, model)
        out.append(Attempt(
            t, [dict(u.label.details["features"]) for u in turns], [u.label.score for u in turns],
            [u.rules.success if u.rules is not None else None for u in turns],
            loops=["model_p" in u.label.details for u in turns],
        ))  # fmt: skip
    return out


def samples(attempts: Sequence[Attempt]) -> list[fitting.Sample]:
    """Every request of every attempt, each attempt counting once (grouped by task)."""
    return fitting.per_attempt([
        fitting.Sample(a.trajectory.instance_id, x, a.trajectory.resolved) for a in attempts for x in a.x
    ])  # fmt: skip


def cross_validate(
    attempts: Sequence[Attempt], features: Sequence[str], folds: int, seed: int, into: str = "cv"
) -> None:
    """Fill each attempt's out-of-fold P(success) per request (attribute ``into``), capped in a
    tool loop as the label is (``infer.capped``) where it measures the label (``cv``)."""
    p = fitting.cross_validate(samples(attempts), features, folds=folds, seed=seed)
    i = 0
    for a in attempts:
        ps = [float(v) for v in p[i : i + len(a.x)]]
        if into == "cv" and a.loops:
            ps = [capped(v, loop) for v, loop in zip(ps, a.loops, strict=True)]
        setattr(a, into, ps)
        i += len(a.x)


def _at(values: Sequence[Any], checkpoint: str | int) -> Any:
    if checkpoint == "last":
        return values[-1] if values else None
    assert isinstance(checkpoint, int)
    return values[checkpoint - 1] if len(values) >= checkpoint else None


def checkpoint_quality(attempts: Sequence[Attempt], checkpoint: str | int, which: str) -> dict[str, Any]:
    """Quality of one label (``cv``, ``steps``, ``shipped`` or ``rules``) at one checkpoint."""
    reached = [a for a in attempts if _at(a.x, checkpoint) is not None]
    if which == "rules":
        pairs = [(_at(a.rules, checkpoint), int(a.trajectory.resolved)) for a in reached]
        judged = [(1.0 if v else 0.0, y) for v, y in pairs if v is not None]
    else:
        judged = [(_at(getattr(a, which), checkpoint), int(a.trajectory.resolved)) for a in reached]
    q = fitting.quality([p for p, _ in judged], [y for _, y in judged])
    q["attempts"] = len(reached)
    q["coverage"] = round(len(judged) / len(reached), 4) if reached else None
    return q


def stop_loss(attempts: Sequence[Attempt], thresholds: Sequence[float] = THRESHOLDS) -> list[dict[str, Any]]:
    """Per threshold t: stop each attempt before its first request with out-of-fold P < t."""
    total = sum(sum(a.trajectory.turn_costs()) for a in attempts)
    resolved = sum(a.trajectory.resolved for a in attempts)
    out = []
    for t in thresholds:
        saved = 0.0
        cut = lost = 0
        for a in attempts:
            k = next((i for i, p in enumerate(a.cv) if p < t), None)
            if k is None:
                continue
            cut += 1
            lost += a.trajectory.resolved
            saved += sum(a.trajectory.turn_costs()[k:])
        out.append({
            "threshold": t, "attempts_cut": cut, "resolved_lost": lost, "resolved": resolved,
            "unresolved_cut": cut - lost, "usd_saved": round(saved, 4), "usd_total": round(total, 4),
            "share_saved": round(saved / total, 4) if total else None,
        })  # fmt: skip
    return out


def evaluate(
    trajectories: Sequence[Trajectory],
    model: LabelModel,
    *,
    shapes: Sequence[str] = SHAPES,
    features: Sequence[str] | None = None,
    folds: int = fitting.FOLDS,
    seed: int = fitting.SEED,
    with_stop_loss: bool = False,
) -> dict[str, Any]:
    features = tuple(features or model.features)
    report: dict[str, Any] = {
        "trajectories": len(trajectories), "resolved": sum(t.resolved for t in trajectories),
        "features": list(features), "folds": folds, "seed": seed, "shipped_model": model.sha256, "shapes": {},
    }  # fmt: skip
    for shape in shapes:
        attempts = replay_all(trajectories, shape, model)
        cross_validate(attempts, features, folds, seed)
        cross_validate(attempts, ("log_steps",), folds, seed, into="steps")
        per: dict[str, Any] = {
            which: {str(c): checkpoint_quality(attempts, c, which) for c in CHECKPOINTS} for which in LABELS
        }
        if with_stop_loss:
            per["stop_loss"] = stop_loss(attempts)
        report["shapes"][shape] = per
    return report


def fit_default(
    trajectories: Sequence[Trajectory], model: LabelModel, features: Sequence[str], out: Path
) -> str:
    """Fit the label model on every request of every trajectory, both shapes; write the artifact."""
    pooled = [s for shape in SHAPES for s in samples(replay_all(trajectories, shape, model))]
    half = [fitting.Sample(s.group, s.x, s.success, s.weight / len(SHAPES)) for s in pooled]
    fitted = fitting.fit(half, features, meta={"fitted_on": "trajectories", "attempts": len(trajectories)})
    out.write_bytes(fitted.to_json())
    return fitted.sha256
