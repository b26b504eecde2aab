"""The objective: the plan with the least expected cost per completed task. Pure arithmetic.

For a candidate m, ``p_m`` is the probability an attempt on m succeeds and ``c_m`` the expected
cost of that attempt. A plan is the sequence of models tried, one attempt each, until one
succeeds or the retry limit is reached:

    cost(plan)    = Σ_k c_k · Π_{j<k} (1 - p_j)
    success(plan) = 1 - Π_k (1 - p_k)

and the quantity minimised is ``cost / success``: the money spent per task that gets done,
failed attempts included. Plans are enumerated exactly (a handful of candidates, a retry
limit of two or three), subject to a success floor and a budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

#: Success of a model that already failed this task, relative to a fresh try: agent runs are
#: noisy, so a repeat is not hopeless, but it is much less likely than the first time.
REPEAT_FACTOR = 0.35


@dataclass(frozen=True, slots=True)
class Option:
    model: str
    p_success: float
    attempt_cost: float


@dataclass(frozen=True, slots=True)
class Plan:
    models: tuple[str, ...]
    expected_cost: float
    success: float

    @property
    def cost_per_completed(self) -> float:
        return self.expected_cost / self.success if self.success > 0 else float("inf")


def evaluate(options: Sequence[Option], already_failed: Sequence[str] = ()) -> Plan:
    """The expected cost and success of trying ``options`` in order."""
    failed = set(already_failed)
    cost, fail_all = 0.0, 1.0
    for o in options:
        p = o.p_success * (REPEAT_FACTOR if o.model in failed else 1.0)
        cost += fail_all * o.attempt_cost
        fail_all *= 1.0 - p
        failed.add(o.model)
    return Plan(tuple(o.model for o in options), cost, 1.0 - fail_all)


def best_plan(
    options: Sequence[Option],
    *,
    attempts_left: int,
    already_failed: Sequence[str] = (),
    min_success: float | None = None,
    budget: float | None = None,
    allow_repeats: bool = True,
) -> Plan:
    """The plan of at most ``attempts_left`` attempts with the least cost per completed task.

    With a success floor, only plans that reach it qualify; if none does, the plan with the
    highest success wins (the floor is a goal, not a reason to refuse work). With a budget,
    plans whose expected cost exceeds it are dropped while any fits — a nearly spent budget
    steps down to cheaper models instead of failing.
    """
    if not options:
        raise ValueError("no options to plan over")
    options = shortlist(options)
    n = max(1, attempts_left)
    plans: list[Plan] = []
    for length in range(1, n + 1):
        seqs = (
            itertools.product(options, repeat=length)
            if allow_repeats
            else itertools.permutations(options, length)
        )
        for seq in seqs:
            plans.append(evaluate(seq, already_failed))
    if budget is not None:
        affordable = [p for p in plans if p.expected_cost <= budget]
        plans = affordable or [min(plans, key=lambda p: p.expected_cost)]
    if min_success is not None:
        meeting = [p for p in plans if p.success >= min_success]
        if not meeting:
            return max(plans, key=lambda p: (p.success, -p.expected_cost))
        plans = meeting
    return min(plans, key=lambda p: (p.cost_per_completed, p.expected_cost, len(p.models)))


def shortlist(options: Sequence[Option], k: int = 7) -> Sequence[Option]:
    """The options worth enumerating: the best by cost per success, the strongest, the cheapest.

    Enumeration grows as k**attempts; a model that is neither efficient, strong nor cheap never
    appears in an optimal plan in practice, so a short list keeps planning in microseconds.
    """
    if len(options) <= k:
        return options
    keep: dict[str, Option] = {}
    by_ratio = sorted(options, key=lambda o: o.attempt_cost / max(o.p_success, 1e-9))
    by_p = sorted(options, key=lambda o: -o.p_success)
    by_cost = sorted(options, key=lambda o: o.attempt_cost)
    for o in [*by_ratio[: k - 3], *by_p[:2], by_cost[0]]:
        keep.setdefault(o.model, o)
    return list(keep.values())
