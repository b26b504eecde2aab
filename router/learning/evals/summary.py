"""Metrics of a replay, and their values over all folds (± the std across folds).

``resolved_rate``: tasks resolved / tasks. ``cost_per_task``: USD spent / tasks, failed attempts
included. ``cost_per_completed``: USD spent / tasks resolved — what one done task costs. Over
folds the three are pooled ratios (sums over every fold's tasks), not means of per-fold ratios:
a mean of ratios overweights the folds that happened to complete few tasks.
``mean_attempts``: attempts / tasks. ``share_of_calls``: each model's share of the LLM calls
(agent steps) made; ``share_of_attempts``: its share of the attempts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from router.learning.evals.simulate import TaskRun

SCALARS = ("resolved_rate", "cost_per_task", "cost_per_completed", "mean_attempts")
SHARES = ("share_of_calls", "share_of_attempts")


def summarize(runs: Sequence[TaskRun], models: Sequence[str]) -> dict[str, Any]:
    if not runs:
        raise ValueError("no tasks to summarise")
    n = len(runs)
    resolved = sum(r.resolved for r in runs)
    cost = sum(r.cost for r in runs)
    attempts = {m: 0 for m in models}
    calls = {m: 0 for m in models}
    for r in runs:
        for m, c in zip(r.models, r.calls, strict=True):
            attempts[m] += 1
            calls[m] += c
    total_attempts = sum(attempts.values()) or 1
    total_calls = sum(calls.values()) or 1
    return {
        "tasks": n,
        "resolved": resolved,
        "cost": cost,
        "resolved_rate": resolved / n,
        "cost_per_task": cost / n,
        "cost_per_completed": cost / resolved if resolved else math.inf,
        "mean_attempts": sum(r.attempts for r in runs) / n,
        "share_of_calls": {m: calls[m] / total_calls for m in models},
        "share_of_attempts": {m: attempts[m] / total_attempts for m in models},
    }


def combine(folds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each metric across folds, with the standard deviation under ``std``."""
    if not folds:
        raise ValueError("no folds to combine")
    tasks, resolved, cost = (sum(f[k] for f in folds) for k in ("tasks", "resolved", "cost"))
    out: dict[str, Any] = {"tasks": tasks, "folds": len(folds), "resolved": resolved, "cost": cost}
    pooled = {"resolved_rate": resolved / tasks, "cost_per_task": cost / tasks,
              "cost_per_completed": cost / resolved if resolved else math.inf}  # fmt: skip
    std: dict[str, float] = {}
    for key in SCALARS:
        values = [f[key] for f in folds]
        out[key] = pooled.get(key, statistics.fmean(values))
        std[key] = statistics.pstdev(values) if len(values) > 1 and all(map(math.isfinite, values)) else 0.0
    for key in SHARES:
        models = folds[0][key].keys()
        out[key] = {m: statistics.fmean(f[key][m] for f in folds) for m in models}
    out["std"] = std
    return out


def rounded(m: dict[str, Any], digits: int = 5) -> dict[str, Any]:
    """A JSON-ready copy: floats rounded, infinities as null."""

    def r(v: Any) -> Any:
        if isinstance(v, float):
            return None if not math.isfinite(v) else round(v, digits)
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        if isinstance(v, list):
            return [r(x) for x in v]
        return v

    return {k: r(v) for k, v in m.items()}
