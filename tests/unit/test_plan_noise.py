"""Planning under the deployment's verifier (router.policy.plan with ``noise``): a wrong result it
accepts ends the task unresolved, a right one it rejects is discarded, and the plan's last result
stands whatever the verdict — the rule ``router eval`` replays and ``router train``'s frontier
counts. Checked against the arithmetic spelled out, and on the scorer that reads the artifact's
verifier."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from router.features.task import vector as taskfeatures
from router.policy import plan as plan_module
from router.policy.artifact import Artifact, ModelParams
from router.policy.learned import LearnedScorer, Objective
from router.policy.plan import Option, Plan, best_plan, evaluate

NOISE = (0.3, 0.2)
WEAK = Option("weak", 0.4, 0.1)
STRONG = Option("strong", 0.8, 1.0)


def test_a_plans_success_and_cost_under_a_noisy_verifier() -> None:
    """weak then strong, FA 0.3, FR 0.2: weak completes 0.4·0.8, goes on 0.4·0.2 + 0.6·0.7 = 0.5
    (its accepted wrong results, 0.6·0.3, end the task), and strong's right result stands."""
    got = evaluate([WEAK, STRONG], noise=NOISE)
    assert got.expected_cost == pytest.approx(0.1 + 0.5 * 1.0)
    assert got.success == pytest.approx(0.4 * 0.8 + 0.5 * 0.8)
    # An exact verifier is the independent formula.
    exact = evaluate([WEAK, STRONG])
    assert exact.success == pytest.approx(1 - 0.6 * 0.2) and exact.expected_cost == pytest.approx(0.7)


def test_a_weak_first_attempt_costs_more_when_its_wrong_results_may_be_accepted() -> None:
    """At a value of 10 per completed task the exact planner opens with the weak model (8.8 − 0.7);
    under the noisy verifier a third of its wrong results end the task unresolved (7.2 − 0.6), and
    the strong model alone is worth more (8 − 1)."""
    assert best_plan([WEAK, STRONG], attempts_left=2, value=10.0).models == ("weak", "strong")
    noisy = best_plan([WEAK, STRONG], attempts_left=2, value=10.0, noise=NOISE)
    assert noisy.models == ("strong",)
    assert noisy.success == pytest.approx(0.8)  # a single attempt's right result stands


def _reference(seq: list[Option], failed: list[Option], task_sd: float, noise: tuple[float, float]) -> Plan:
    """The replay's rule node by node: the task's difficulty weighed by the rejections seen, then
    each attempt completes (right, accepted), ends it (wrong, accepted) or goes on (rejected)."""
    fa, fr = noise
    if task_sd > 0:
        _, w = plan_module._quadrature(plan_module.NODES)
        chance = {o.model: plan_module.conditional_success(o.p_success, task_sd) for o in [*seq, *failed]}
    else:
        w = (1.0,)
        chance = {o.model: np.array([o.p_success]) for o in [*seq, *failed]}
    post = np.array(w)
    for o in failed:
        post = post * (chance[o.model] * fr + (1 - chance[o.model]) * (1 - fa))
    post = post / post.sum()
    cost = success = 0.0
    for node, weight in enumerate(post):
        alive, tried = 1.0, {o.model for o in failed}
        for k, o in enumerate(seq):
            p = chance[o.model][node] * (plan_module.REPEAT_FACTOR if o.model in tried else 1.0)
            cost += weight * alive * o.attempt_cost
            success += weight * alive * p * (1.0 if k == len(seq) - 1 else 1.0 - fr)
            alive *= p * fr + (1 - p) * (1 - fa)
            tried.add(o.model)
    return Plan(tuple(o.model for o in seq), cost, success)


def test_best_plan_under_noise_agrees_with_enumerating_every_plan() -> None:
    rng = random.Random(7)
    for _ in range(150):
        k = rng.randint(1, 4)
        options = [Option(f"m{i}", rng.uniform(0.05, 0.95), rng.uniform(0.1, 3.0)) for i in range(k)]
        failed = rng.sample(options, rng.randint(0, k))
        left, sd = rng.randint(1, 3), rng.choice([0.0, rng.uniform(0.5, 2.5)])
        noise = (rng.uniform(0, 0.4), rng.uniform(0, 0.4))
        value = rng.choice([1.0, 5.0, 20.0])
        plans = [
            _reference(list(seq), failed, sd, noise)
            for n in range(1, left + 1)
            for seq in itertools.product(options, repeat=n)
        ]
        want = min(plans, key=lambda p: (-round(p.gain(value), 12), p.expected_cost, len(p.models)))
        got = best_plan(
            options, attempts_left=left, already_failed=[o.model for o in failed], value=value,
            task_sd=sd, noise=noise,
        )  # fmt: skip
        assert got.models == want.models, (options, failed, left, sd, noise)
        assert got.success == pytest.approx(want.success, rel=1e-9)
        assert got.expected_cost == pytest.approx(want.expected_cost, rel=1e-9)
        again = evaluate([{o.model: o for o in options}[m] for m in got.models], failed, sd, noise)
        assert again.success == pytest.approx(want.success, rel=1e-9)
        assert again.expected_cost == pytest.approx(want.expected_cost, rel=1e-9)


def test_outcomes_by_value_plan_under_the_same_verifier() -> None:
    values = np.array([0.5, 2.0, 10.0, 50.0])
    success, cost, first = plan_module.outcomes_by_value([WEAK, STRONG], values, attempts_left=2, noise=NOISE)
    for i, v in enumerate(values):
        plan = best_plan([WEAK, STRONG], attempts_left=2, value=float(v), noise=NOISE)
        go = plan.worth_trying(float(v))
        assert first[i] == (plan.models[0] if go else None)
        assert success[i] == pytest.approx(plan.success if go else 0.0)
        assert cost[i] == pytest.approx(plan.expected_cost if go else 0.0)


def _artifact(noise: tuple[float, float]) -> Artifact:
    width = len(taskfeatures.NUMERIC) + taskfeatures.HASH_DIM
    params = {
        o.model: ModelParams(
            weights=(0.0,) * width,
            platt=(1.0, math.log(o.p_success / (1 - o.p_success))),
            cost_weights=(math.log(o.attempt_cost),),
            calls_per_attempt=10.0,
            n=100,
        )
        for o in (WEAK, STRONG)
    }
    return Artifact(models=params, noise=noise)


def test_the_scorer_plans_under_the_verifier_its_artifact_learned_through() -> None:
    task = taskfeatures.task_vector("fix the failing test in the parser")
    objective = Objective(max_attempts=2, value=10.0)
    exact = LearnedScorer(_artifact((0.0, 0.0)), objective).choose(task, ["weak", "strong"])
    noisy = LearnedScorer(_artifact(NOISE), objective).choose(task, ["weak", "strong"])
    assert exact.plan.models == ("weak", "strong")
    assert noisy.plan.models == ("strong",)
