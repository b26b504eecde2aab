"""What the policy page shows beside the file: the control arm, each arm's numbers for the
revision in force, the guard's settings and state, the scopes (pure: no I/O, no HTML).

The arms' numbers are those of ``router report --by arm`` over the same window
(``router.rollout.arms.arm_report``), so the page and the command never disagree.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from router.policy.active import ActivePolicy
from router.policy.config import GuardSpec, PolicyFile, Targets
from router.policy.control import CONTROL, TREATED
from router.rollout.arms import arm_report
from router.store import OutcomeRecord, RequestRecord

#: Arms in the order shown (and coloured: control first), any other after them.
ARM_ORDER = (CONTROL, TREATED)


def targets(t: Targets) -> str:
    """A route's backends in a few words: ``a, b (fallbacks c)`` or ``passthrough a``."""
    chosen = f"passthrough {t.passthrough}" if t.passthrough else ", ".join(t.candidates)
    return chosen + (f" (fallbacks {', '.join(t.fallbacks)})" if t.fallbacks else "")


def control(rt: ActivePolicy) -> dict[str, Any] | None:
    """The control arm: its share of tasks and what decides it (None without one)."""
    spec = rt.policy.spec.control
    if spec is None or rt.control is None:
        return None
    routes = [(r.match, targets(r)) for r in rt.control.decider.policy.routes]
    return {
        "share": spec.share,
        "route": targets(spec.route) if spec.route is not None else None,
        "policy": rt.control.reference if spec.policy is not None else None,
        "scorer": rt.control.decider.scorer.name,
        "routes": routes,
    }


def arms(
    requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord], revision: str | None
) -> dict[str, Any]:
    """Each arm's summary for ``revision`` (as ``router report --by arm``), with the chart rows,
    and the other revisions of the window that had arms."""
    report = arm_report(requests, outcomes)
    mine = next((r for r in report["revisions"] if r["revision"] == revision), None)
    summaries = dict(mine["arms"]) if mine else {}
    order = [a for a in ARM_ORDER if a in summaries] + sorted(set(summaries) - set(ARM_ORDER))
    rows = [(a, summaries[a]) for a in order]
    success = [(a, s["success_rate"], *(s["success_ci95"] or (None, None))) for a, s in rows]
    cost = [
        (a, s["cost_per_completed_usd"], *(s["cost_per_completed_ci95"] or (None, None))) for a, s in rows
    ]
    return {
        "rows": rows,
        "success_chart": success if any(r[1] is not None for r in success) else [],
        "cost_chart": cost if any(r[1] is not None for r in cost) else [],
        "other_revisions": [r["revision"] for r in report["revisions"] if r["revision"] != revision],
    }


def guard(
    spec: GuardSpec | None, state: Mapping[str, Any] | None, since: float | None
) -> dict[str, Any] | None:
    """The guard's settings, and its last verdict on the revision in force (None before its first
    check of it); ``since``: when the revision was applied, where the guard starts counting."""
    if spec is None:
        return None
    threshold = 2 / spec.alpha
    out: dict[str, Any] = {"spec": spec, "threshold": threshold, "since": since, "state": None}
    if state is not None:
        status: str | None = "watching"
        if state.get("worse"):
            status = "worse than control"
        elif str(state.get("reason", "")).startswith("waiting"):
            status = None  # "waiting: …" says it
        out["state"] = {
            **state,
            "status": status,
            "control_share": min(1.0, state.get("control_tasks", 0) / spec.min_tasks),
            "treated_share": min(1.0, state.get("treated_tasks", 0) / spec.min_tasks),
        }
    return out


def scopes(policy: PolicyFile) -> list[dict[str, Any]]:
    """Each scope: its name, what it matches, and what it lays over the policy's own sections
    (``router.policy.scopes.overlay``: a route by its match, a rule by its name, objective fields)."""
    routes, rules = {r.match for r in policy.routes}, {r.name for r in policy.rules}

    def which(name: str, known: set[str]) -> str:
        return "in place of the policy's" if name in known else "added"

    out = []
    for s in policy.scopes:
        match = ", ".join(f"{k} = {v}" for k, v in s.match.model_dump(exclude_none=True).items())
        overrides = [f"route {r.match} → {targets(r)} ({which(r.match, routes)})" for r in s.routes or ()]
        overrides += [f"rule {r.name} ({which(r.name, rules)})" for r in s.rules or ()]
        if s.objective is not None:
            fields = s.objective.model_dump(exclude_unset=True)
            overrides += (
                ["objective: " + ", ".join(f"{k} = {v}" for k, v in fields.items())] if fields else []
            )
        out.append({"name": s.name, "match": match, "overrides": overrides})
    return out


def diff(against: str, old: bytes | None, current: str, new: bytes | None,
         artifacts: tuple[bytes | None, bytes | None]) -> dict[str, Any] | None:  # fmt: skip
    """What changed from revision ``against`` to ``current``: the policy file's lines (unified
    diff) and whether the pinned artifact's bytes differ; None when either file was not kept."""
    if old is None or new is None:
        return None
    lines = list(difflib.unified_diff(old.decode("utf-8", "replace").splitlines(),
                                      new.decode("utf-8", "replace").splitlines(),
                                      f"{against}/policy.yaml", f"{current}/policy.yaml", lineterm="", n=2))  # fmt: skip
    # Shown as "sha256 1f7592c73db5… → none": the ellipsis marks a cut hash, so an absent one has none.
    before, after = (hashlib.sha256(a).hexdigest()[:12] + "…" if a is not None else "none" for a in artifacts)
    return {
        "against": against,
        "lines": [
            (line[:1] if line[:1] in "+-@" and not line.startswith(("+++", "---")) else "", line)
            for line in lines
        ],
        "artifact": None if before == after else (before, after),
    }
