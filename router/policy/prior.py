"""The prior plan: the best *fixed* plan on the training log, and when a task may leave it.

A fixed plan is one order of models for every task, tried until one succeeds or the order ends
(stopping is its end). ``router train`` measures every such order on the training log — the share
of tasks it completes and what it spends per task, from how each model did on the tasks where
the models before it had failed — and keeps the orders no other beats on both (the frontier). For
an objective the prior plan is then the best of them: for a value V, the order worth most
(``V · success − cost``, or none: stop); for a target, the one with the least cost per completed
task among those reaching it, which is exactly how the best fixed cascade is chosen, so the
policy cannot lose to that cascade except through the noise between training and new tasks.

A task leaves the prior plan only when its own plan (the per-task model's) is expected to be
worth more than what is left of the prior plan by more than a margin (a share of V). The margin
is chosen on out-of-fold replays of the training tasks (``router.learning.training.value``); where
no margin gained there, it is infinite and the policy is the prior plan. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from router.policy.plan import Plan

#: Values searched for the least one at which the frontier's best order reaches a target.
_VALUES = np.geomspace(1e-4, 1e4, 321)


@dataclass(frozen=True, slots=True)
class FixedPlan:
    models: tuple[str, ...]
    #: Share of the training tasks it completes, and its mean cost per task there.
    success: float
    cost: float

    def worth(self, value: float) -> float:
        return value * self.success - self.cost

    @property
    def cost_per_completed(self) -> float:
        return self.cost / self.success if self.success > 0 else math.inf


STOP = FixedPlan((), 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Point:
    """An operating point measured by ``router train``: the prior plan at a value (or a target),
    the deviation margin chosen for it, and what the policy did on the out-of-fold replay."""

    value: float
    target: float | None
    margin: float  # math.inf: never leave the prior plan
    success: float
    cost: float
    #: Share of attempts that left the prior plan, and the gain per task that bought (USD).
    deviations: float = 0.0
    gain: float = 0.0
    #: For a target: how far above it, and among orders of how many models at most, the prior plan
    #: is chosen (``router.learning.training.margin``: the cheapest order reaching the target on the
    #: training log mostly ran lucky there). An artifact without them: at the target, any length.
    above: float = 0.0
    longest: int | None = None


def pareto(plans: Sequence[FixedPlan]) -> list[FixedPlan]:
    """The plans no other completes more tasks for no more money (ties: the shorter), by cost."""
    out: list[FixedPlan] = []
    for p in sorted(plans, key=lambda p: (p.cost, -p.success, len(p.models))):
        if not out or p.success > out[-1].success:
            out.append(p)
    return out


def for_value(frontier: Sequence[FixedPlan], value: float) -> FixedPlan:
    """The order worth most at ``value`` (``STOP`` when none is worth its cost)."""
    best = max(frontier, key=lambda p: (round(p.worth(value), 12), -p.cost), default=STOP)
    return best if best.worth(value) > 0 else STOP


def for_target(frontier: Sequence[FixedPlan], target: float) -> FixedPlan:
    """The least cost per completed task among orders completing ``target`` (else the strongest)."""
    if not frontier:
        return STOP
    meeting = [p for p in frontier if p.success >= target]
    if not meeting:
        return max(frontier, key=lambda p: (p.success, -p.cost))
    return min(meeting, key=lambda p: (p.cost_per_completed, len(p.models)))


def for_target_above(
    frontiers: Mapping[int, Sequence[FixedPlan]], k: int, target: float, above: float = 0.0,
    longest: int | None = None,
) -> tuple[Sequence[FixedPlan], float]:  # fmt: skip
    """The frontier and the share the prior plan for ``target`` with up to ``k`` attempts is chosen
    among and at: orders of at most ``longest`` models, at ``target + above`` (``Point.above``)."""
    n = k if longest is None else min(k, longest)
    if n in frontiers:
        return frontiers[n], target + above
    # The artifact keeps the frontiers of some lengths only: the longest kept that fits.
    fit = [j for j in frontiers if j <= n]
    return (frontiers[max(fit)] if fit else ()), target + above


def value_of_target(frontier: Sequence[FixedPlan], target: float) -> float:
    """The least value at which the order worth most completes ``target`` of the training tasks
    (the largest value searched if none does): what a completed task is worth at that target."""
    for v in _VALUES:
        if for_value(frontier, float(v)).success >= target:
            return float(v)
    return float(_VALUES[-1])


def least_cost_per_completed(frontier: Sequence[FixedPlan]) -> FixedPlan:
    """The order that costs least per completed task (ties: the shorter), ``STOP`` if none completes any."""
    done = [p for p in frontier if p.success > 0]
    return min(done, key=lambda p: (p.cost_per_completed, len(p.models))) if done else STOP


def value_of_plan(frontier: Sequence[FixedPlan], plan: FixedPlan) -> float:
    """The least value at which ``plan`` is the order worth most (its own cost per completed task
    when it never is: the value at which it starts to be worth its cost)."""
    for v in _VALUES:
        if for_value(frontier, float(v)).models == plan.models:
            return float(v)
    return plan.cost_per_completed


def default_point(frontier: Sequence[FixedPlan], points: Sequence[Point], plan: FixedPlan) -> Point | None:
    """The measured point standing for ``plan`` without a value: the least value at which it is the
    prior plan (so its margin says whether leaving it paid out of fold where it is served)."""
    own = [p for p in points if p.target is None and for_value(frontier, p.value).models == plan.models]
    return min(own, key=lambda p: p.value) if own else None


def remainder(
    prior: Sequence[str], failed: Sequence[str], allowed: Sequence[str], attempts_left: int
) -> list[str]:
    """What is left of the prior plan: its models not yet failed, among those allowed, in order."""
    done = set(failed)
    return [m for m in prior if m not in done and m in allowed][: max(0, attempts_left)]


def deviates(best: Plan, rest: Plan | None, value: float, margin: float) -> bool:
    """Leave the prior plan? Only when the task's own best (or stopping, worth 0) is expected to be
    worth more than what is left of the prior (``rest``; None: nothing left) by ``margin · value``."""
    if math.isinf(margin):
        return False
    own = max(best.gain(value), 0.0)
    kept = rest.gain(value) if rest is not None else 0.0
    return own - kept > margin * value


def nearest(
    points: Sequence[Point], *, value: float | None = None, target: float | None = None
) -> Point | None:
    """The stored point for this target (exactly), or the value point nearest ``value`` (log scale)."""
    if target is not None:
        return next((p for p in points if p.target is not None and abs(p.target - target) < 1e-9), None)
    by_value = [p for p in points if p.target is None]
    if value is None or not by_value:
        return None
    return min(by_value, key=lambda p: abs(math.log(p.value / value)))
