"""The planner's arithmetic (router.policy.plan) against answers worked out independently: by hand for
small cases, and by direct numerical integration (a dense grid, not the planner's Gauss–Hermite
nodes) with a task effect. No expected value here is computed by the code under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from router.policy.plan import (
    NODES,
    REPEAT_FACTOR,
    Option,
    _quadrature,
    best_plan,
    conditional_success,
    evaluate,
)

A = Option("A", 0.5, 1.0)
B = Option("B", 0.8, 3.0)


def test_repeat_factor_is_documented_value() -> None:
    # The hand computations below use 0.35: a model that failed a task keeps 35% of its chance.
    assert REPEAT_FACTOR == 0.35


@pytest.mark.parametrize(
    ("plan", "failed", "cost", "success"),
    [
        # One attempt: its cost, its chance.
        ([A], (), 1.0, 0.5),
        # A, then B if A failed (half the time): 1 + 0.5·3; fails only if both do: 1 − 0.5·0.2.
        ([A, B], (), 2.5, 0.9),
        ([B, A], (), 3.0 + 0.2 * 1.0, 0.9),
        # A again after A failed: 0.5·0.35 = 0.175 the second time.
        ([A, A], (), 1.5, 1 - 0.5 * 0.825),
        # A already failed this task: 0.175 from the start; B is not affected.
        ([A], ("A",), 1.0, 0.175),
        ([B, A], ("A",), 3.0 + 0.2 * 1.0, 1 - 0.2 * 0.825),
        ([], (), 0.0, 0.0),
    ],
)
def test_plan_cost_and_success_by_hand(
    plan: list[Option], failed: tuple[str, ...], cost: float, success: float
) -> None:
    got = evaluate(plan, failed)
    assert got.models == tuple(o.model for o in plan)
    assert got.expected_cost == pytest.approx(cost, abs=1e-12)
    assert got.success == pytest.approx(success, abs=1e-12)
    if success:
        assert got.cost_per_completed == pytest.approx(cost / success, abs=1e-12)
    else:
        assert got.cost_per_completed == math.inf


def test_quadrature_has_the_moments_of_a_standard_normal() -> None:
    u, w = (np.array(x) for x in _quadrature(NODES))
    assert len(u) == NODES
    # Exact for polynomials up to degree 2·9 − 1: E1 = 1, Eu = 0, Eu² = 1, Eu⁴ = 3, Eu⁶ = 15.
    assert [float(w @ u**k) for k in (0, 1, 2, 4, 6)] == pytest.approx([1, 0, 1, 3, 15], abs=1e-9)


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("task_sd", [0.5, 1.0, 2.0, 3.0])
def test_task_effect_averages_back_to_p(p: float, task_sd: float) -> None:
    """A model's success averaged over tasks' difficulty is its success on tasks like this: the
    logit is stretched so that it is (issue 23's fifth surviving fault, the stretch removed)."""
    _, w = _quadrature(NODES)
    assert float(np.array(w) @ conditional_success(p, task_sd)) == pytest.approx(p, abs=0.015)


def test_task_effect_spreads_success_across_tasks() -> None:
    u, _ = _quadrature(NODES)
    by_node = conditional_success(0.3, 2.0)
    assert list(by_node) == sorted(by_node)  # harder tasks (u < 0) are less likely to succeed
    assert by_node[0] < 0.05 and by_node[-1] > 0.9
    assert conditional_success(0.3, 0.0) == pytest.approx([0.3] * len(u))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def integrated(plan: list[Option], failed: tuple[str, ...], task_sd: float) -> tuple[float, float]:
    """Expected cost and success by integrating over the task's difficulty u ~ N(0, 1) on a dense
    grid: P(success | u) = σ(stretch · logit(p) + task_sd · u), a model's chance kept at 35% once it
    failed, and the density conditioned on the failures already seen."""
    u = np.linspace(-10, 10, 20001)
    density = np.exp(-(u**2) / 2)
    stretch = math.sqrt(1 + math.pi * task_sd**2 / 8)

    def p_given_u(o: Option) -> np.ndarray:
        return _sigmoid(math.log(o.p_success / (1 - o.p_success)) * stretch + task_sd * u)

    by_model = {o.model: o for o in plan}
    for name in failed:
        density = density * (1 - p_given_u(by_model[name]))
    density = density / density.sum()
    alive, cost, tried = np.ones_like(u), 0.0, set(failed)
    for o in plan:
        cost += o.attempt_cost * float(density @ alive)
        alive = alive * (1 - p_given_u(o) * (REPEAT_FACTOR if o.model in tried else 1.0))
        tried.add(o.model)
    return cost, 1.0 - float(density @ alive)


C = Option("C", 0.3, 1.0)
D = Option("D", 0.7, 4.0)
E = Option("E", 0.5, 2.0)


@pytest.mark.parametrize("task_sd", [0.5, 1.0, 2.2])
@pytest.mark.parametrize(
    ("plan", "failed"),
    [([C, D], ()), ([C, D, E], ()), ([D, C], ("C",)), ([C, C], ()), ([E, D, C], ("C", "E"))],
)
def test_plan_with_a_task_effect_matches_direct_integration(
    plan: list[Option], failed: tuple[str, ...], task_sd: float
) -> None:
    cost, success = integrated(plan, failed, task_sd)
    got = evaluate(plan, failed, task_sd)
    # Nine nodes are not exact for these curves: within a few parts in a thousand (more when two
    # failures push the task far into the hard tail).
    assert got.expected_cost == pytest.approx(cost, rel=3e-3)
    assert got.success == pytest.approx(success, abs=2e-3)


def test_task_effect_by_hand_when_every_model_is_even() -> None:
    """p = 0.5: the logit is 0 whatever the stretch, and σ(s·u) averages to ½ by symmetry."""
    even, pricey = Option("X", 0.5, 1.0), Option("Y", 0.5, 2.0)
    got = evaluate([even, pricey], (), task_sd=1.5)
    # The second attempt is paid when the first fails: half the time, task effect or not.
    assert got.expected_cost == pytest.approx(1.0 + 0.5 * 2.0, abs=1e-12)
    # But failures go together (a hard task is hard for both): success is below the independent ¾.
    independent = evaluate([even, pricey], ()).success
    assert independent == pytest.approx(0.75) and got.success < 0.75 - 0.02


def test_a_failure_seen_makes_the_task_look_harder() -> None:
    fresh = evaluate([D], (), task_sd=2.0).success
    after_c_failed = evaluate([C, D], ("C",), task_sd=2.0)
    independent = evaluate([C, D], ("C",), task_sd=0.0)
    assert fresh == pytest.approx(0.7, abs=0.015)
    # With a task effect, C's failure lowers D's chance too; without one, it does not.
    assert after_c_failed.success < independent.success - 0.05


def test_a_failure_outside_the_plan_counts_as_best_plan_counts_it() -> None:
    """C failed; the plan left is D alone. With a task effect C's failure says the task is hard, so
    ``evaluate`` must agree with ``best_plan``, which weighs it (it used to be ignored: C is not in
    the plan scored)."""
    chosen = best_plan([C, D], attempts_left=1, already_failed=("C",), allow_repeats=False, task_sd=2.0)
    assert chosen.models == ("D",)
    got = evaluate([D], (C,), task_sd=2.0)
    assert got.success == pytest.approx(chosen.success, abs=1e-12)
    assert got.expected_cost == pytest.approx(chosen.expected_cost, abs=1e-12)
    assert got.success < evaluate([D], (), task_sd=2.0).success - 0.05


def test_a_failed_model_whose_chance_is_unknown_is_refused_with_a_task_effect() -> None:
    # Silently ignoring the failure overstates success; without its chance it cannot be weighed.
    with pytest.raises(ValueError, match="C"):
        evaluate([D], ("C",), task_sd=2.0)
    # Without a task effect a failure elsewhere changes nothing, so a name is enough.
    assert evaluate([D], ("C",)).success == pytest.approx(0.7)
