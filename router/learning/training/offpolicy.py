"""Off-policy evaluation: how a new policy would have done on the traffic an old one logged.

Each logged attempt carries the probability (propensity) with which the logging policy chose
its model. For a deterministic new policy, inverse propensity scoring weighs the attempts where
both policies agree by 1/propensity; the self-normalised variant divides by the sum of weights
instead of n, trading a little bias for much less variance. Confidence intervals come from a
bootstrap over attempts. Agreement is rare when the logging policy never explored: the report
says how many attempts the estimate rests on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from router.learning.training.dataset import AttemptRow


@dataclass(frozen=True, slots=True)
class OffPolicyEstimate:
    success: float
    cost_per_attempt: float
    cost_per_completed: float
    ci_success: tuple[float, float]
    ci_cost_per_completed: tuple[float, float]
    matched: int


def _point(rows: Sequence[AttemptRow], agree: Sequence[bool], snips: bool) -> tuple[float, float]:
    w = [(1.0 / max(r.propensity, 1e-6)) if a else 0.0 for r, a in zip(rows, agree, strict=True)]
    denom = sum(w) if snips else len(rows)
    if denom <= 0:
        return float("nan"), float("nan")
    success = sum(wi * r.success for wi, r in zip(w, rows, strict=True)) / denom
    cost = sum(wi * r.cost for wi, r in zip(w, rows, strict=True)) / denom
    return success, cost


def evaluate(
    rows: Sequence[AttemptRow], choose: Callable[[AttemptRow], str], *, snips: bool = True,
    resamples: int = 200, seed: int = 0,
) -> OffPolicyEstimate:  # fmt: skip
    agree = [choose(r) == r.model for r in rows]
    success, cost = _point(rows, agree, snips)
    rng = random.Random(seed)
    succ_s, cpc_s = [], []
    idx = range(len(rows))
    for _ in range(resamples):
        pick = [rng.choice(idx) for _ in idx]
        s, c = _point([rows[i] for i in pick], [agree[i] for i in pick], snips)
        if s != s:  # NaN: no resampled attempt agrees, nothing to estimate
            continue
        # A resample without a success still counts for the success rate (0); only cost per
        # completed task is undefined there. Dropping it biased the success interval upwards.
        succ_s.append(s)
        if s > 0:
            cpc_s.append(c / s)
    return OffPolicyEstimate(
        # Inverse-propensity weights can carry an estimate past 1 on few matched attempts; a
        # probability and its interval are shown within [0, 1].
        success=min(max(success, 0.0), 1.0) if success == success else success,
        cost_per_attempt=cost,
        cost_per_completed=cost / success if success and success == success else float("inf"),
        ci_success=_clamp01(_ci(succ_s)),
        ci_cost_per_completed=_ci(cpc_s),
        matched=sum(agree),
    )


def logged(rows: Sequence[AttemptRow]) -> OffPolicyEstimate:
    """The logging policy's own numbers: plain means over what it did."""
    unweighted = [replace(r, propensity=1.0) for r in rows]
    return evaluate(unweighted, lambda r: r.model, snips=False)


def _clamp01(ci: tuple[float, float]) -> tuple[float, float]:
    return (min(max(ci[0], 0.0), 1.0), min(max(ci[1], 0.0), 1.0)) if ci[0] == ci[0] else ci


def _ci(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float("nan"), float("nan")
    s = sorted(samples)
    return s[int(0.025 * (len(s) - 1))], s[int(0.975 * (len(s) - 1))]
