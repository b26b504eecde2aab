"""The learned scorer (router.policy.learned) on a hand-made artifact whose answers are known by hand:
every weight is zero but each model's Platt offset and cost, so P(success) = σ(offset) and an
attempt costs exactly what its cost weight says, whatever the task.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from router.features.task import vector as taskfeatures
from router.policy.learned import TYPICAL_CALLS, Artifact, LearnedScorer, ModelParams, Objective
from router.policy.plan import Option

WIDTH = len(taskfeatures.NUMERIC) + taskfeatures.HASH_DIM
#: (P(success), cost of an attempt in USD) per model.
MODELS = {"cheap": (0.3, 0.01), "mid": (0.5, 0.05), "strong": (0.8, 0.2)}
TASK = taskfeatures.task_vector("fix the failing test in the parser")


def artifact(models: dict[str, tuple[float, float]] = MODELS, task_sd: float = 0.0) -> Artifact:
    params = {
        name: ModelParams(
            weights=(0.0,) * WIDTH,
            platt=(1.0, math.log(p / (1 - p))),
            cost_weights=(math.log(cost),),  # the bias feature is 1: cost = exp(log cost)
            calls_per_attempt=10.0,
            n=100,
        )
        for name, (p, cost) in models.items()
    }
    return Artifact(sha256="0" * 64, models=params, schema=taskfeatures.schema(), task_sd=task_sd)


def every_attempt_worth_making(max_attempts: int) -> Objective:
    """An objective under which more success is always worth its cost, so a plan uses every
    attempt it may: a very valuable task (or, before values, an unreachable success floor)."""
    names = {f.name for f in dataclasses.fields(Objective)}
    knob: dict[str, Any] = {"value": 1e6} if "value" in names else {"min_success": 0.9999}
    return Objective(max_attempts=max_attempts, **knob)


def test_options_are_the_artifacts_success_and_cost() -> None:
    scorer = LearnedScorer(artifact(), Objective())
    opts = {o.model: o for o in scorer.options(TASK, list(MODELS))}
    for name, (p, cost) in MODELS.items():
        assert opts[name].p_success == pytest.approx(p, abs=1e-12)
        assert opts[name].attempt_cost == pytest.approx(cost, rel=1e-12)


def test_a_model_the_log_has_not_seen_gets_an_even_chance() -> None:
    scorer = LearnedScorer(artifact(), Objective())
    with_call = {o.model: o for o in scorer.options(TASK, ["cheap", "new"], per_call_cost={"new": 0.002})}
    assert with_call["new"] == Option("new", 0.5, pytest.approx(0.002 * TYPICAL_CALLS))
    # Without a per-call estimate: the median attempt cost of the known models (0.05 of 3).
    median = {o.model: o for o in scorer.options(TASK, [*MODELS, "new"])}
    assert median["new"] == Option("new", 0.5, pytest.approx(0.05))


@pytest.mark.parametrize(
    ("attempt", "plan", "cost", "success"),
    [
        # Three attempts left: all three models, cheapest order first (the most likely to succeed
        # at all: 1 − 0.7·0.5·0.2 = 0.93; cost 0.01 + 0.7·0.05 + 0.7·0.5·0.2 = 0.115).
        (1, ("cheap", "mid", "strong"), 0.115, 0.93),
        # Two left: the best pair, 1 − 0.5·0.2 = 0.9, cheaper as mid then strong (0.05 + 0.5·0.2).
        (2, ("mid", "strong"), 0.15, 0.9),
        # One left: the strongest.
        (3, ("strong",), 0.2, 0.8),
        # Past the limit the router still serves: one attempt.
        (5, ("strong",), 0.2, 0.8),
    ],
)
def test_plan_uses_every_attempt_left(
    attempt: int, plan: tuple[str, ...], cost: float, success: float
) -> None:
    """Issue 23's third surviving fault: the scorer's attempts left off by one."""
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    got, _ = scorer.plan(TASK, list(MODELS), attempt=attempt)
    assert len(got.models) == max(1, 3 - attempt + 1)
    assert got.models == plan
    assert got.expected_cost == pytest.approx(cost, abs=1e-12)
    assert got.success == pytest.approx(success, abs=1e-12)


def test_a_failed_model_counts_at_35_percent() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=2))
    got, _ = scorer.plan(TASK, list(MODELS), attempt=2, failed=("strong",))
    # One attempt left; strong already failed: 0.8·0.35 = 0.28 < mid's 0.5.
    assert got.models == ("mid",) and got.success == pytest.approx(0.5)


def test_remembered_plans_change_with_the_attempt_alone() -> None:
    """Issue 23's fourth surviving fault: a plan cache keyed without the attempt number. Only the
    attempt changes between the calls: same vector object, candidates, failures and budget."""
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    first, _ = scorer.plan(TASK, list(MODELS), attempt=1)
    second, _ = scorer.plan(TASK, list(MODELS), attempt=2)
    third, _ = scorer.plan(TASK, list(MODELS), attempt=3)
    assert [len(p.models) for p in (first, second, third)] == [3, 2, 1]
    again, _ = scorer.plan(TASK, list(MODELS), attempt=2)
    assert again is second  # remembered, not searched again


def test_remembered_plans_change_with_the_failures_and_the_budget() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=1))
    plain, _ = scorer.plan(TASK, list(MODELS))
    failed, _ = scorer.plan(TASK, list(MODELS), failed=("strong",))
    poor, _ = scorer.plan(TASK, list(MODELS), budget=0.06)
    assert (plain.models, failed.models, poor.models) == (("strong",), ("mid",), ("mid",))
