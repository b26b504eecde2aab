"""The prior plan (router.policy.prior, router.learning.training.prior): the best fixed order on the
training log, by hand-made cases, and the learned scorer keeping to it unless a task's own plan
clears the margin."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from router.errors import ConfigError
from router.features.task.vector import schema
from router.learning.training import prior as training_prior
from router.learning.training import value
from router.learning.training.dataset import AttemptRow
from router.policy import prior
from router.policy.active import objective_for
from router.policy.artifact import FORMAT, Artifact
from router.policy.config import Policy
from router.policy.learned import LearnedScorer, Objective
from router.policy.loading import load_policy
from router.policy.plan import Plan
from router.policy.prior import STOP, FixedPlan
from tests.unit.test_learned_values import MODELS, TASK, artifact, estimates, features
from tests.unit.test_scopes import M

CHEAP = FixedPlan(("cheap",), 0.5, 0.01)
PAIR = FixedPlan(("cheap", "strong"), 0.8, 0.05)
STRONG = FixedPlan(("strong",), 0.7, 0.1)  # dominated by PAIR: more success for less
FRONTIER = prior.pareto([CHEAP, PAIR, STRONG])


def test_the_frontier_drops_orders_another_beats() -> None:
    assert FRONTIER == [CHEAP, PAIR]


def test_the_frontier_keeps_one_order_per_cost_and_per_success() -> None:
    same_cost = FixedPlan(("other",), 0.4, 0.01)  # CHEAP's cost, less success
    longer = FixedPlan(("cheap", "other"), 0.5, 0.01)  # CHEAP's cost and success, one model more
    dearer = FixedPlan(("cheap", "mid"), 0.5, 0.02)  # CHEAP's success for more money
    assert prior.pareto([same_cost, longer, dearer, PAIR, CHEAP]) == [CHEAP, PAIR]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4.0, 10.0),  # log-scale: 4 is nearer 10 (x2.5) than 1 (x4), though not in dollars
        (2.0, 1.0),
        (0.001, 0.1),
        (1e6, 10.0),
    ],
)
def test_the_operating_point_for_a_value_is_the_nearest_on_a_log_scale(value: float, expected: float) -> None:
    points = [prior.Point(v, None, 0.1, 0.5, 0.01) for v in (1.0, 0.1, 10.0)]
    target = prior.Point(3.0, 0.8, 0.2, 0.8, 0.05)  # a target's point is never a value's
    found = prior.nearest([target, *points], value=value)
    assert found is not None and found.value == expected


def test_the_operating_point_for_a_target_is_that_target_only() -> None:
    points = [prior.Point(0.2, 0.75, 0.1, 0.75, 0.04), prior.Point(0.5, None, 0.3, 0.6, 0.02)]
    assert prior.nearest(points, target=0.75) == points[0]
    assert prior.nearest(points, target=0.7) is None  # not measured: no point
    assert prior.nearest(points) is None  # neither a value nor a target
    assert prior.nearest(points[:1], value=0.5) is None  # no value point at all


def read(**blocks: object) -> Artifact:
    return Artifact.from_json(
        orjson.dumps({"format": FORMAT, "feature_schema": schema(), **blocks}), source="a.json"
    )


def test_prior_plans_and_operating_points_read_back_as_training_wrote_them() -> None:
    frontier = {2: (FixedPlan(("cheap",), 0.5, 0.01), FixedPlan(("cheap", "strong"), 0.8125, 0.0625))}
    points = {
        2: (
            prior.Point(0.125, None, 0.0625, 0.5, 0.015625, 0.25, 0.03125),
            prior.Point(0.25, 0.75, math.inf, 0.75, 0.046875),
        )
    }
    written = orjson.loads(dataclasses.replace(artifact(), frontiers=frontier, points=points).to_json())
    assert written["prior_plans"] == {"2": [[["cheap"], 0.5, 0.01], [["cheap", "strong"], 0.8125, 0.0625]]}
    assert written["operating_points"]["2"][1] == {
        "value": 0.25, "target": 0.75, "margin": None, "success": 0.75, "cost": 0.046875,
        "deviations": 0.0, "gain": 0.0,
    }  # fmt: skip
    back = read(prior_plans=written["prior_plans"], operating_points=written["operating_points"])
    assert back.frontiers == frontier and back.points == points
    # Rounded as training keeps them: 6 decimals for dollars, 5 for the success, 4 for shares.
    assert value.rounded(prior.Point(1 / 3, 0.8, 0.1, 2 / 3, 1 / 7, 1 / 9, 1 / 11)) == prior.Point(
        0.333333, 0.8, 0.1, 0.66667, 0.142857, 0.1111, 0.090909
    )
    assert training_prior.rounded({1: [FixedPlan(("a",), 2 / 3, 1 / 7)]}) == {
        1: (FixedPlan(("a",), 0.66667, 0.142857),)
    }
    # What older training runs left out: no target, no margin (never leave), no deviations.
    (bare,) = read(operating_points={"1": [{"value": 1, "success": 0.5, "cost": 0.01}]}).points[1]
    assert bare == prior.Point(1.0, None, math.inf, 0.5, 0.01, 0.0, 0.0)
    assert read().frontiers == {} and read().points == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.01, STOP),  # 0.5·0.01 − 0.01 < 0: no order is worth its cost
        (0.05, CHEAP),  # 0.015 against PAIR's −0.01
        # CHEAP 0.5V − 0.01, PAIR 0.8V − 0.05: PAIR is worth more past V = 0.04/0.3 ≈ 0.133.
        (0.13, CHEAP),
        (0.14, PAIR),
    ],
)
def test_the_prior_for_a_value_is_the_order_worth_most(value: float, expected: FixedPlan) -> None:
    assert prior.for_value(FRONTIER, value) == expected


def test_the_prior_for_a_value_at_the_edges() -> None:
    assert prior.for_value([], 1.0) == STOP  # no order at all
    # CHEAP at V = 0.02 is worth 0.5·0.02 − 0.01 = 0: not worth trying.
    assert prior.for_value(FRONTIER, 0.02) == STOP
    # Worth the same (0.01 at V = 0.04: 0.5·0.04 − 0.01 = 0.75·0.04 − 0.02): the cheaper.
    even = FixedPlan(("cheap", "mid"), 0.75, 0.02)
    assert prior.for_value([CHEAP, even], 0.04) == CHEAP
    assert prior.for_value([even, CHEAP], 0.04) == CHEAP


def test_the_prior_for_a_target_is_the_least_cost_per_completed_task_reaching_it() -> None:
    # A non-hull order: 0.75 at 0.045 costs 0.06 per completed task, PAIR 0.0625.
    between = FixedPlan(("cheap", "mid"), 0.75, 0.045)
    frontier = prior.pareto([CHEAP, PAIR, between])
    assert prior.for_target(frontier, 0.7) == between
    assert prior.for_target(frontier, 0.78) == PAIR
    assert prior.for_target(frontier, 0.4) == CHEAP  # 0.02 per completed task, the least
    assert prior.for_target(frontier, 0.95) == PAIR  # out of reach: the strongest
    assert prior.for_target(frontier, 0.75) == between  # exactly at the target reaches it
    assert prior.for_target([], 0.5) == STOP
    assert prior.value_of_target(FRONTIER, 0.95) == 1e4  # never reached: the largest value searched
    # The value a target stands for: the least at which the best order reaches it (V ≈ 0.133 for PAIR).
    assert prior.value_of_target(FRONTIER, 0.8) == pytest.approx(0.04 / 0.3, rel=0.03)
    assert prior.for_value(FRONTIER, prior.value_of_target(FRONTIER, 0.8)) == PAIR


def test_what_is_left_of_the_prior_skips_failed_and_disallowed_models() -> None:
    order = ("a", "b", "c")
    assert prior.remainder(order, (), "abc", 3) == ["a", "b", "c"]
    assert prior.remainder(order, ("a",), "abc", 2) == ["b", "c"]
    assert prior.remainder(order, ("x",), "abc", 2) == ["a", "b"]  # a deviation failed: back to the order
    assert prior.remainder(order, (), "ac", 3) == ["a", "c"]  # b is not a candidate of this route
    assert prior.remainder(order, ("a", "b", "c"), "abc", 1) == []
    assert prior.remainder(order, (), "abc", 0) == []  # no attempt left


def test_a_task_leaves_the_prior_only_past_the_margin() -> None:
    rest = Plan(("a",), 0.1, 0.5)  # worth 0.5·1 − 0.1 = 0.4 at V = 1
    own = Plan(("b",), 0.1, 0.6)  # worth 0.5
    assert prior.deviates(own, rest, 1.0, 0.05)
    assert not prior.deviates(own, rest, 1.0, 0.1)  # a gain of 0.1 does not clear 0.1·V
    assert not prior.deviates(own, rest, 1.0, math.inf)
    # Stopping is a deviation too: the rest is worth −0.05, stopping 0.
    losing = Plan(("a",), 0.15, 0.1)
    assert prior.deviates(Plan(("b",), 1.0, 0.1), losing, 1.0, 0.0)
    assert not prior.deviates(Plan(("b",), 1.0, 0.1), None, 1.0, 0.0)  # nothing left, nothing to gain


def row(task: str, model: str, success: bool, cost: float) -> AttemptRow:
    return AttemptRow(task, 1, model, {0: 1.0}, success, "explicit", cost, 1, 0.5, ["a", "b"])


def test_orders_from_a_full_log_are_the_exact_replay_of_each_order() -> None:
    # Four tasks, both models tried on each: a solves t1, t2; b solves t2, t3.
    outcomes = {"t1": (1, 0), "t2": (1, 1), "t3": (0, 1), "t4": (0, 0)}
    rows = [
        row(t, m, bool(s), c)
        for t, ss in outcomes.items()
        for m, s, c in zip("ab", ss, (1.0, 3.0), strict=True)
    ]
    groups = np.array([int(r.task_id[1]) - 1 for r in rows])
    plans = {p.models: p for p in training_prior.orders(rows, groups, 2)}
    shrink = training_prior.SHRINK
    assert plans["a",].success == pytest.approx((2 + shrink * 0.5) / (4 + shrink))
    # a → b: a completes 2 of 4; of the two a failed, b completes t3. Exactly 3/4 at 1 + ½·3 without
    # shrinkage; with it, each step leans by one pseudo-task towards the model's overall rate.
    p_a = (2 + shrink * 0.5) / (4 + shrink)
    p_b_after = (1 + shrink * 0.5) / (2 + shrink)
    assert plans["a", "b"].success == pytest.approx(p_a + (1 - p_a) * p_b_after)
    assert plans["a", "b"].cost == pytest.approx(1.0 + (1 - p_a) * 3.0)
    # With a noisy verifier a right result is rejected a fifth of the time, and the task goes on
    # (paying for b); on an order's last step it stands whatever the verdict: nothing replaces it.
    noisy = {p.models: p for p in training_prior.orders(rows, groups, 2, noise=(0.0, 0.2))}
    assert noisy["a",].success == pytest.approx(plans["a",].success)
    assert noisy["a", "b"].cost == pytest.approx(1.0 + (1 - 0.8 * p_a) * 3.0)


def test_orders_from_a_large_full_log_are_exactly_each_orders_replay() -> None:
    rng = np.random.default_rng(3)
    n = 60  # every step measured on at least FULL_SUPPORT tasks (most fail): no shrinkage
    s = rng.random((n, 3)) < [0.2, 0.3, 0.4]
    c = rng.uniform(0.5, 2.0, (n, 3))
    rows = [row(f"t{t}", m, bool(s[t, j]), float(c[t, j])) for t in range(n) for j, m in enumerate("abc")]
    groups = np.repeat(np.arange(n), 3)
    for plan in training_prior.orders(rows, groups, 2):
        cols = ["abc".index(m) for m in plan.models]
        done, spent = 0, 0.0
        for t in range(n):  # the order replayed task by task: try until one succeeds
            for j in cols:
                spent += c[t, j]
                if s[t, j]:
                    done += 1
                    break
        assert (plan.success, plan.cost) == pytest.approx((done / n, spent / n)), plan.models


def objective(prior_plan: tuple[str, ...], margin: float, value: float = 1.0) -> Objective:
    return Objective(max_attempts=3, value=value, prior=prior_plan, margin=margin)


def test_the_scorer_keeps_to_the_prior_plan_and_stops_where_it_ends() -> None:
    # cheap 0.3 at 0.01, mid 0.5 at 0.05, strong 0.8 at 0.2: at V = 1 the task's own plan starts
    # elsewhere than mid, yet with an infinite margin the prior mid → strong is followed.
    scorer = LearnedScorer(artifact(), objective(("mid", "strong"), math.inf))
    first = scorer.choose(TASK, ["cheap", "mid", "strong"], attempt=1)
    assert first.prior and first.go and first.plan.models == ("mid", "strong")
    second = scorer.recommend(TASK, ["cheap", "mid", "strong"], attempt=2, failed=["mid"])
    assert second.retry and second.model == "strong"
    # The order is spent: stop, though attempts are left.
    third = scorer.recommend(TASK, ["cheap", "mid", "strong"], attempt=3, failed=["mid", "strong"])
    assert not third.retry
    # Served anyway (the client retried): the task's own best plan.
    served = scorer.choose(TASK, ["cheap", "mid", "strong"], attempt=3, failed=["mid", "strong"])
    assert served.plan.models == ("cheap",)


def test_the_scorer_leaves_the_prior_when_its_own_plan_clears_the_margin() -> None:
    # A prior of the strong model alone at V = 0.1 is worth 0.08 − 0.2 < 0; stopping is worth 0
    # and cheap alone 0.03 − 0.01 > 0: a clear gain.
    leaving = LearnedScorer(artifact(), objective(("strong",), 0.0, value=0.1))
    chosen = leaving.choose(TASK, ["cheap", "mid", "strong"], attempt=1)
    assert not chosen.prior and chosen.plan.models[0] == "cheap"
    staying = LearnedScorer(artifact(), objective(("strong",), math.inf, value=0.1))
    assert staying.choose(TASK, ["cheap", "mid", "strong"], attempt=1).plan.models == ("strong",)


def test_what_is_left_of_the_prior_is_valued_knowing_what_failed() -> None:
    # mid failed: with a task effect the task is likely a hard one, so strong is now below its 0.8.
    for sd, below in ((1.0, True), (0.0, False)):
        scorer = LearnedScorer(artifact(task_sd=sd), objective(("mid", "strong"), math.inf))
        rest = scorer.choose(TASK, ["cheap", "mid", "strong"], attempt=2, failed=["mid"])
        assert rest.prior and rest.plan.models == ("strong",)
        assert rest.plan.success < 0.79 if below else rest.plan.success == pytest.approx(0.8)


def test_a_prior_plan_over_the_budget_gives_way_to_the_tasks_own() -> None:
    strong_only = Objective(max_attempts=1, value=1.0, prior=("strong",), margin=math.inf)
    scorer = LearnedScorer(artifact(), strong_only)
    assert scorer.choose(TASK, ["cheap", "mid", "strong"]).plan.models == ("strong",)
    poor = scorer.choose(TASK, ["cheap", "mid", "strong"], budget=0.06)  # strong costs 0.2
    assert not poor.prior and poor.plan.models == ("mid",)


def test_the_margin_is_measured_against_what_is_left_of_the_prior() -> None:
    # One attempt at V = 1: mid is worth 0.5 − 0.05 = 0.45, the task's own best (strong) 0.6. A gain
    # of 0.15 does not clear a margin of 0.2, though strong alone is worth more than that.
    kept = LearnedScorer(artifact(), Objective(max_attempts=1, value=1.0, prior=("mid",), margin=0.2))
    choice = kept.choose(TASK, ["cheap", "mid", "strong"])
    assert choice.prior and choice.plan.models == ("mid",)
    left = LearnedScorer(artifact(), Objective(max_attempts=1, value=1.0, prior=("mid",), margin=0.1))
    assert left.choose(TASK, ["cheap", "mid", "strong"]).plan.models == ("strong",)


def test_rank_says_when_it_follows_the_prior_plan() -> None:
    scorer = LearnedScorer(artifact(), objective(("mid", "strong"), math.inf))
    cost = estimates({"strong": 0.001, "mid": 0.002, "cheap": 0.003})
    ranked, _, reason = scorer.rank(features(task_vector=TASK), cost)
    assert ranked[0].model == "mid"
    # 0.05 + 0.5·0.2 = 0.15 for 1 − 0.5·0.2 = 0.9: $0.1667 per completed task.
    assert reason == "prior plan mid → strong: expected $0.1667 per completed task, success 90%"
    assert {e.model: e.p_success for e in ranked} == {"cheap": 0.3, "mid": 0.5, "strong": 0.8}
    # The prior plan is spent (mid and strong failed) and the client tries again: the task's own
    # plan serves it, and the reason does not call that the prior plan.
    spent = features(task_vector=TASK, attempt=3, failed_models=("mid", "strong"))
    _, _, reason = scorer.rank(spent, cost)
    assert reason.startswith("plan cheap: ")


def policy_with(tmp_path: Path, objective: dict[str, object]) -> Policy:
    doc = {"version": 1, "name": "p", "models": [{**M, "id": m, "prices": {"input": 1, "output": 1}} for m in MODELS],
           "routes": [{"match": "auto", "candidates": list(MODELS)}], "objective": objective}  # fmt: skip
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_policy(path)


def test_the_objective_takes_its_prior_plan_value_and_margin_from_the_artifact(tmp_path: Path) -> None:
    points = (prior.Point(0.5, None, 0.1, 0.6, 0.02), prior.Point(0.2, 0.75, math.inf, 0.75, 0.04))
    art = dataclasses.replace(artifact(), frontiers={2: tuple(FRONTIER)}, points={2: points})
    by_value = objective_for(policy_with(tmp_path, {"max_attempts": 2, "value_per_completed_usd": 0.05}), art)
    assert (by_value.prior, by_value.value, by_value.margin) == (
        CHEAP.models,
        0.05,
        0.1,
    )  # the nearest point's margin
    # A target: the least cost per completed task reaching it; the value and margin of its point.
    by_target = objective_for(policy_with(tmp_path, {"max_attempts": 2, "target_success": 0.75}), art)
    assert (by_target.prior, by_target.value, by_target.margin) == (PAIR.models, 0.2, math.inf)
    # A target train did not measure: the frontier's value for it, and no deviation.
    other = objective_for(policy_with(tmp_path, {"max_attempts": 2, "target_success": 0.6}), art)
    assert other.prior == PAIR.models and other.margin == math.inf
    assert other.value == pytest.approx(prior.value_of_target(FRONTIER, 0.6))
    # No value: no prior plan, each task planned alone.
    assert objective_for(policy_with(tmp_path, {"max_attempts": 2}), art).prior is None
    with pytest.raises(ConfigError, match=r"no prior plans for max_attempts=3.*retrain"):
        objective_for(policy_with(tmp_path, {"max_attempts": 3, "target_success": 0.7}), art)


def test_the_default_single_shot_serves_the_best_single_model(tmp_path: Path) -> None:
    # CHEAP completes half the tasks at $0.01 ($0.02 per completed task), the other orders cost more
    # per completed task: with neither a value nor a target, single shot serves CHEAP.
    single = (CHEAP, FixedPlan(("strong",), 0.75, 0.06))
    assert prior.least_cost_per_completed(single) == CHEAP
    assert prior.least_cost_per_completed(()) == STOP
    # Whether a task may leave it is the margin measured at the least value at which CHEAP is the
    # prior plan (the points at which it is not, or at a target, say nothing about it).
    points = (
        prior.Point(0.01, None, 0.0, 0.0, 0.0),  # stop is the prior here
        prior.Point(0.05, None, 0.3, 0.5, 0.01),
        prior.Point(0.06, None, 0.1, 0.5, 0.01),
        prior.Point(0.05, 0.5, 0.0, 0.5, 0.01),
    )
    assert prior.default_point(single, points, CHEAP) == points[1]
    art = dataclasses.replace(artifact(), frontiers={1: single}, points={1: points})
    o = objective_for(policy_with(tmp_path, {"max_attempts": 1}), art)
    assert (o.prior, o.value, o.margin, o.default) == (CHEAP.models, 0.05, 0.3, True)
    # No point measured for it: CHEAP at the value where it starts being the prior, never left.
    bare = objective_for(policy_with(tmp_path, {"max_attempts": 1}), dataclasses.replace(art, points={}))
    assert bare.prior == CHEAP.models and bare.margin == math.inf and bare.default
    assert prior.for_value(single, bare.value).models == CHEAP.models
    # A value given is not the default.
    assert not objective_for(
        policy_with(tmp_path, {"max_attempts": 1, "value_per_completed_usd": 1.0}), art
    ).default
