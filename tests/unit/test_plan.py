"""The objective, plan choice, dataset labels, calibration and the artifact's checks."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import orjson
import pytest

from router.errors import ConfigError
from router.features.task.vector import Vector, task_vector, to_json
from router.learning.training import dataset, offpolicy, value
from router.learning.training.fit import fit
from router.policy import plan as plan_module
from router.policy import prior as prior_module
from router.policy.artifact import Artifact
from router.policy.learned import LearnedScorer, Objective
from router.policy.plan import Option, Plan, best_plan, evaluate
from router.store import OutcomeRecord, RequestRecord
from router.store.records import Estimate

CHEAP = Option("cheap", 0.5, 1.0)
STRONG = Option("strong", 0.9, 4.0)


def test_plan_arithmetic() -> None:
    p = evaluate([CHEAP, STRONG])
    assert p.expected_cost == pytest.approx(1.0 + 0.5 * 4.0)
    assert p.success == pytest.approx(1 - 0.5 * 0.1)
    assert p.cost_per_completed == pytest.approx(3.0 / 0.95)


def test_best_plan_minimises_cost_per_completed_task() -> None:
    # cheap alone: 1/0.5 = 2.0 per completed; strong alone: 4/0.9 = 4.44; cheap then cheap again is
    # penalised as a repeat. The cheap model first, then strong, beats strong alone.
    plan = best_plan([CHEAP, STRONG], attempts_left=1)
    assert plan.models == ("cheap",)
    hard = [Option("cheap", 0.05, 1.0), STRONG]
    assert best_plan(hard, attempts_left=3).models[0] == "strong"


def test_stopping_is_right_when_the_next_attempt_is_worth_less_than_it_costs() -> None:
    # Worth $3 a completed task. After "cheap" failed, a repeat succeeds 0.5 × 0.35 = 0.175 of the
    # time (gain 3 × 0.175 − 1 = −0.475) and "strong" 0.9 (3 × 0.9 − 4 = −1.3): stop.
    after = best_plan([CHEAP, STRONG], attempts_left=1, already_failed=["cheap"], value=3.0)
    assert after.gain(3.0) == pytest.approx(3.0 * 0.175 - 1.0)
    assert not after.worth_trying(3.0)
    # Fresh, cheap is worth it: 3 × 0.5 − 1 = 0.5 > 0, and more than strong's 3 × 0.9 − 4 < 0.
    fresh = best_plan([CHEAP, STRONG], attempts_left=1, value=3.0)
    assert fresh.models == ("cheap",) and fresh.gain(3.0) == pytest.approx(0.5)


def test_escalating_is_right_when_a_completed_task_is_worth_enough() -> None:
    # Worth $10: after cheap failed, strong gains 10 × 0.9 − 4 = 5 > 0 (and beats a repeat of cheap,
    # 10 × 0.175 − 1 = 0.75); from scratch, cheap then strong (10 × 0.95 − 3 = 6.5) beats strong alone
    # (10 × 0.9 − 4 = 5) and cheap alone (10 × 0.5 − 1 = 4).
    after = best_plan([CHEAP, STRONG], attempts_left=1, already_failed=["cheap"], value=10.0)
    assert after.models == ("strong",) and after.gain(10.0) == pytest.approx(5.0)
    fresh = best_plan([CHEAP, STRONG], attempts_left=2, value=10.0, allow_repeats=False)
    assert fresh.models == ("cheap", "strong") and fresh.gain(10.0) == pytest.approx(6.5)
    # Without a value, any plan is worth making (the least cost per completed task, as before).
    assert best_plan([CHEAP, STRONG], attempts_left=1, already_failed=["cheap"]).worth_trying(None)


def test_budget_steps_down() -> None:
    # A budget that only the cheap model fits steps down to it, whatever the value.
    assert best_plan([STRONG, CHEAP], attempts_left=1, budget=2.0, value=100.0).models == ("cheap",)


def test_failed_models_count_less() -> None:
    fresh = best_plan([CHEAP, STRONG], attempts_left=1)
    after = best_plan([CHEAP, STRONG], attempts_left=1, already_failed=["cheap"])
    assert fresh.models == ("cheap",) and after.models == ("strong",)


def _reference_correlated(
    seq: tuple[Option, ...], options: list[Option], already_failed: list[str], task_sd: float
) -> Plan:
    """The task-effect arithmetic of the module docstring, node by node in plain Python: what the
    failures so far say of the task's difficulty, then the plan's failure chances at each node."""
    _, w = plan_module._quadrature(plan_module.NODES)
    post = list(w)
    for o in options:
        if o.model in already_failed:
            post = [
                a * (1 - q)
                for a, q in zip(post, plan_module.conditional_success(o.p_success, task_sd), strict=True)
            ]
    post = [a / sum(post) for a in post] if sum(post) > 0 else list(w)
    tried, alive, cost = set(already_failed), post, 0.0
    for o in seq:
        cost += o.attempt_cost * sum(alive)
        factor = plan_module.REPEAT_FACTOR if o.model in tried else 1.0
        alive = [
            a * (1 - q * factor)
            for a, q in zip(alive, plan_module.conditional_success(o.p_success, task_sd), strict=True)
        ]
        tried.add(o.model)
    return Plan(tuple(o.model for o in seq), cost, 1 - sum(alive))


def _reference_best_plan(
    options: list[Option], attempts_left: int, already_failed: list[str], value: float | None,
    budget: float | None, allow_repeats: bool, task_sd: float = 0.0,
) -> Plan:  # fmt: skip
    """best_plan's rules, spelled out: every plan evaluated, then filtered and ranked."""
    plans = [
        evaluate(seq, already_failed)
        if task_sd == 0
        else _reference_correlated(seq, options, already_failed, task_sd)
        for n in range(1, attempts_left + 1)
        for seq in (
            itertools.product(options, repeat=n) if allow_repeats else itertools.permutations(options, n)
        )
    ]
    if budget is not None:
        plans = [p for p in plans if p.expected_cost <= budget] or [min(plans, key=lambda p: p.expected_cost)]
    if value is not None:
        return min(plans, key=lambda p: (-round(p.gain(value), 12), p.expected_cost, len(p.models)))
    return min(plans, key=lambda p: (p.cost_per_completed, p.expected_cost, len(p.models)))


def test_best_plan_agrees_with_enumerating_every_plan() -> None:
    rng = random.Random(3)
    for _ in range(400):
        k = rng.randint(1, 5)
        # Rounded values make ties (equal costs, equal ratios) common: the tie-breaks must agree too.
        options = [Option(f"m{i}", rng.choice([0.0, 0.2, 0.5, 0.9, 1.0]), rng.choice([0.5, 1.0, 2.0]))
                   for i in range(k)]  # fmt: skip
        kwargs = {
            "attempts_left": rng.randint(1, 3),
            "already_failed": rng.sample([o.model for o in options], rng.randint(0, k)),
            "value": rng.choice([None, 0.5, 2.0, 10.0]),
            "budget": rng.choice([None, 0.7, 1.5, 3.0]),
            "allow_repeats": rng.random() < 0.5,
        }
        assert best_plan(options, **kwargs) == _reference_best_plan(options, **kwargs), (options, kwargs)


def test_best_plan_with_a_task_effect_agrees_with_the_arithmetic_node_by_node() -> None:
    rng = random.Random(5)
    for _ in range(150):
        k = rng.randint(1, 4)
        options = [Option(f"m{i}", rng.uniform(0.05, 0.95), rng.uniform(0.1, 3.0)) for i in range(k)]
        kwargs = {
            "attempts_left": rng.randint(1, 3),
            "already_failed": rng.sample([o.model for o in options], rng.randint(0, k)),
            "value": rng.choice([None, 1.0, 5.0]),
            "budget": rng.choice([None, 0.5, 2.0]),
            "allow_repeats": rng.random() < 0.5,
            "task_sd": rng.uniform(0.5, 2.5),
        }
        got, want = best_plan(options, **kwargs), _reference_best_plan(options, **kwargs)
        assert got.models == want.models, (options, kwargs)
        assert got.expected_cost == pytest.approx(want.expected_cost, rel=1e-9)
        assert got.success == pytest.approx(want.success, rel=1e-9)


def test_shortlist_keeps_planning_bounded() -> None:
    rng = random.Random(0)
    many = [Option(f"m{i}", rng.uniform(0.1, 0.9), rng.uniform(0.1, 5)) for i in range(24)]
    plan = best_plan(many, attempts_left=3)
    ratio = min(many, key=lambda o: o.attempt_cost / o.p_success)
    assert plan.cost_per_completed <= ratio.attempt_cost / ratio.p_success + 1e-9


def rows_for(n: int, seed: int = 0) -> list[dataset.AttemptRow]:
    """Tasks about races fail on 'cheap' and succeed on 'strong'; typo tasks succeed on both."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        hard = i % 2 == 0
        vec = task_vector(("fix the race deadlock " if hard else "fix the typo docstring ") + str(i))
        for model, cost in (("cheap", 0.01), ("strong", 0.04)):
            ok = (model == "strong") or not hard
            if rng.random() < 0.05:
                ok = not ok
            rows.append(
                dataset.AttemptRow(f"t{i}", 1, model, vec, ok, "explicit", cost, 5, 0.5, ["cheap", "strong"])
            )
    return rows


def test_fit_is_calibrated_and_separates_tasks() -> None:
    artifact = fit(rows_for(80))
    metrics = artifact.report["metrics"]
    assert metrics["brier"] < metrics["brier_base_rate"]
    bins = metrics["reliability"]
    assert sum(b["n"] for b in bins) == 160
    for b in bins:
        if b["n"] >= 15:
            assert abs(b["predicted"] - b["observed"]) < 0.25, b
    hard = task_vector("fix the race deadlock 999")
    easy = task_vector("fix the typo docstring 999")
    assert artifact.models["cheap"].p_success(hard) < 0.3 < 0.7 < artifact.models["cheap"].p_success(easy)
    scorer = LearnedScorer(artifact, Objective(max_attempts=1))
    assert scorer.plan(hard, ["cheap", "strong"])[0].models == ("strong",)
    assert scorer.plan(easy, ["cheap", "strong"])[0].models == ("cheap",)
    cost = artifact.models["strong"].attempt_cost(easy)
    assert cost == pytest.approx(0.04, rel=0.2)


def test_the_scorer_remembers_plans_per_attempt_within_a_bound() -> None:
    artifact = fit(rows_for(20))
    scorer = LearnedScorer(artifact, Objective(max_attempts=2), memory=2)
    hard = task_vector("fix the race deadlock 1")
    first = scorer.plan(hard, ["cheap", "strong"])
    again = scorer.plan(hard, ["cheap", "strong"])  # the same question, answered from memory
    assert again[0] is first[0] and again[1] is first[1]
    assert scorer.plan(dict(hard), ["cheap", "strong"])[0] is not first[0]  # another task's vector
    # Anything the answer depends on asks anew: the attempt, the failures, the budget, a cost
    # the artifact cannot know (a model it has not seen).
    second = scorer.plan(hard, ["cheap", "strong"], attempt=2, failed=["strong"])
    assert second[0] != first[0]
    assert scorer.plan(hard, ["cheap", "strong"], budget=0.0)[0] is not first[0]
    new = scorer.plan(hard, ["cheap", "strong", "new"], per_call_cost={"new": 0.001})
    assert scorer.plan(hard, ["cheap", "strong", "new"], per_call_cost={"new": 0.5})[0] is not new[0]
    assert len(scorer._plans) == 2  # the oldest answers were forgotten
    assert scorer.plan(hard, ["cheap", "strong"])[0] is not first[0]


def test_artifact_refuses_wrong_hash_and_schema() -> None:
    raw = fit(rows_for(20)).to_json()
    with pytest.raises(ConfigError, match="sha256 mismatch"):
        Artifact.from_json(raw, source="a.json", expected_sha256="0" * 64)
    obj = orjson.loads(raw)
    obj["feature_schema"]["hash_dim"] = 7
    with pytest.raises(ConfigError, match="feature schema mismatch"):
        Artifact.from_json(orjson.dumps(obj), source="a.json", expected_sha256=None)
    with pytest.raises(ConfigError, match="not a learned-policy artifact"):
        Artifact.from_json(b'{"format": "pickle"}', source="a.json", expected_sha256=None)


def test_dataset_labels_explicit_over_weak_and_abandoned() -> None:
    vec = to_json(task_vector("x"))
    req = RequestRecord("r", 100.0, task_id="a", attempt=1, chosen_model="m", status=200, cost_usd=0.1,
                        task_features=vec, propensity=0.5, candidates=[Estimate("m", 0, 0, 0, 0.0), Estimate("n", 0, 0, 0, 0.0)])  # fmt: skip
    weak = OutcomeRecord("a", 1, False, None, "tests", None, 101, False)
    explicit = OutcomeRecord("a", 1, True, None, "explicit", None, 99, True)
    [row] = dataset.build([req], [weak, explicit], now=200)
    assert row.success and row.label_source == "explicit" and row.actions == ["m", "n"]
    [row] = dataset.build([req], [weak], now=200)
    assert not row.success and row.label_source == "tests"
    assert dataset.build([req], [], now=200, abandon_after_s=1000) == []  # still in progress
    [row] = dataset.build([req], [], now=5000, abandon_after_s=1000)
    assert row.label_source == "abandoned" and not row.success


def test_offpolicy_estimates_recover_a_known_policy() -> None:
    rows = rows_for(200, seed=1)
    # Uniform logging over two models: propensity 0.5. The target policy: strong on hard tasks only.
    hard = {r.task_id for r in rows if r.model == "cheap" and not r.success}

    def choose(r: dataset.AttemptRow) -> str:
        return "strong" if r.task_id in hard else "cheap"

    est = offpolicy.evaluate(rows, choose)
    truth = [r for r in rows if r.model == choose(r)]
    assert est.success == pytest.approx(np.mean([r.success for r in truth]), abs=0.02)
    assert est.ci_success[0] <= est.success <= est.ci_success[1]
    assert offpolicy.logged(rows).success == pytest.approx(np.mean([r.success for r in rows]))


def test_output_tokens_are_learned_per_model_and_used_by_the_decision() -> None:
    from router.learning.training.outputs import fit_output_tokens

    rng = random.Random(3)
    reqs = []
    for _ in range(200):
        prompt = rng.randint(1_000, 100_000)
        # 'verbose' writes ~10x what 'terse' does, growing slowly with the prompt.
        for model, scale in (("terse", 20), ("verbose", 200)):
            out = int(scale * (prompt / 1000) ** 0.3 * rng.uniform(0.7, 1.3))
            reqs.append(RequestRecord(f"r{len(reqs)}", 1.0, status=200, chosen_model=model, input_tokens=prompt,
                                      output_tokens=out))  # fmt: skip
    artifact = dataclasses.replace(fit(rows_for(20)), output_tokens=fit_output_tokens(reqs))
    terse, verbose = artifact.expected_output("terse", 10_000), artifact.expected_output("verbose", 10_000)
    assert terse is not None and verbose is not None
    assert 30 <= terse <= 60 and 300 <= verbose <= 600  # ~20·10^0.3 ≈ 40 and ~400
    assert artifact.expected_output("verbose", 100_000) > verbose  # grows with the prompt
    assert artifact.expected_output("unknown", 10_000) is None


def test_offpolicy_success_and_its_interval_stay_probabilities() -> None:
    # Few matched attempts with small propensities: IPS weights carry the raw estimate past 1.
    rows = [
        dataset.AttemptRow(
            task_id=f"t{i}",
            attempt=1,
            model="a" if i < 3 else "b",
            vector={},
            success=True,
            label_source="explicit",
            cost=1.0,
            n_calls=1,
            propensity=0.1,
            actions=["a", "b"],
        )
        for i in range(10)
    ]
    est = offpolicy.evaluate(rows, lambda r: "a", snips=False)
    assert 0.0 <= est.ci_success[0] <= est.ci_success[1] <= 1.0
    assert est.success == 1.0  # 3 matched x weight 10 / 10 rows = 3.0 unclamped


def test_the_success_interval_keeps_the_resamples_without_a_success() -> None:
    # One success in four attempts: about a third of bootstrap resamples hold no success at all.
    # Their success rate, 0, belongs in the interval (only cost per completed task is undefined
    # there); dropping them had put the lower end at 25% for this log of 25%.
    rows = [
        dataset.AttemptRow(
            task_id=f"t{i}", attempt=1, model="a", vector={}, success=i == 0, label_source="explicit",
            cost=1.0, n_calls=1, propensity=1.0, actions=["a"],
        )
        for i in range(4)
    ]  # fmt: skip
    est = offpolicy.logged(rows)
    assert est.success == 0.25
    assert est.ci_success[0] == 0.0 < est.success < est.ci_success[1]
    assert est.ci_cost_per_completed[0] >= 1.0  # never below one attempt's cost per success


def test_training_writes_prior_plans_and_operating_points_per_retry_limit() -> None:
    rows = rows_for(60)
    artifact = fit(rows, max_attempts=2, target=0.83)
    assert set(artifact.frontiers) == {1, 2, 3} and set(artifact.points) == {1, 2, 3}
    # The frontier: more success always costs more, and no order longer than the retry limit.
    for k, plans in artifact.frontiers.items():
        assert all(len(p.models) <= k for p in plans)
        assert [p.cost for p in plans] == sorted(p.cost for p in plans)
        assert [p.success for p in plans] == sorted(p.success for p in plans)
    assert any(p.target == 0.83 for p in artifact.points[2])  # the policy's own target is measured
    shares = [s for _, s, _ in artifact.value_curves[2]]
    assert shares[0] == 0.0 and shares[-1] > 0.85  # more value, more done


def test_the_replay_follows_the_prior_plan_and_leaves_it_only_past_the_margin() -> None:
    artifact = fit(rows_for(60), max_attempts=2)
    # Two hand-made tasks, an easy one and one only "strong" solves, replayed as the log has them.
    tasks = [
        {"cheap": value.Logged(0.9, True, 0.01), "strong": value.Logged(0.95, True, 0.04)},
        {"cheap": value.Logged(0.3, False, 0.01), "strong": value.Logged(0.8, True, 0.05)},
    ]
    vectors = [task_vector("fix the typo docstring 1"), task_vector("fix the race 2")]
    ops = [
        value._Op(v, None, prior) for v in (0.02, 0.1, 1.0) for prior in ((), ("cheap",), ("strong", "cheap"))
    ]
    scorer = LearnedScorer(artifact, Objective())

    def spelled_out(
        logged: dict[str, value.Logged], vec: Vector, op: value._Op, margin: float
    ) -> tuple[float, float]:
        """Plan, try, replan after a failure; keep to the prior unless the task's own plan clears the margin."""
        costs = {o.model: o.attempt_cost for o in scorer.options(vec, ["cheap", "strong"])}
        opts = {m: Option(m, seen.p_success, costs[m]) for m, seen in logged.items()}
        failed: list[str] = []
        done, spent = 0.0, 0.0
        for left in (2, 1):
            best = best_plan(list(opts.values()), attempts_left=left, already_failed=failed, value=op.value,
                             task_sd=artifact.task_sd)  # fmt: skip
            rest_models = prior_module.remainder(op.prior, failed, list(opts), left)
            rest = (
                evaluate([opts[m] for m in rest_models], [opts[m] for m in failed], artifact.task_sd)
                if rest_models else None
            )  # fmt: skip
            if prior_module.deviates(best, rest, op.value, margin):
                model = best.models[0] if best.worth_trying(op.value) else None
            else:
                model = rest_models[0] if rest_models else None
            if model is None:
                break
            spent += logged[model].cost
            if logged[model].success:
                done = 1.0
                break
            failed.append(model)
        return done, spent

    for logged, vec in zip(tasks, vectors, strict=True):
        costs = {o.model: o.attempt_cost for o in scorer.options(vec, ["cheap", "strong"])}
        opts = [Option(m, seen.p_success, costs[m]) for m, seen in logged.items()]
        got = value._replay(opts, logged, ops, 2, artifact.task_sd, (0.0, 0.0))
        for i, op in enumerate(ops):
            for j, margin in enumerate(value.MARGINS):
                assert (got[0, i, j], got[1, i, j]) == pytest.approx(spelled_out(logged, vec, op, margin)), (
                    op,
                    margin,
                )
    # The prior plan alone is the fixed order: the second task under strong → cheap costs 0.05, done.
    alone = value._replay(
        [Option("cheap", 0.3, 0.01), Option("strong", 0.8, 0.05)], tasks[1], [value._Op(1.0, None, ("strong", "cheap"))],
        2, 0.0, (0.0, 0.0),
    )  # fmt: skip
    assert (alone[0, 0, -1], alone[1, 0, -1]) == (1.0, 0.05)


def test_outcomes_by_value_agree_with_best_plan() -> None:
    rng = random.Random(7)
    for _ in range(60):
        options = [
            Option(f"m{i}", rng.uniform(0.05, 0.95), rng.uniform(0.1, 3.0)) for i in range(rng.randint(1, 4))
        ]
        values = np.array([0.1, 1.0, 3.0, 10.0, 100.0])
        sd, n = rng.choice([0.0, 1.5]), rng.randint(1, 3)
        failed = rng.sample([o.model for o in options], rng.randint(0, len(options)))
        success, cost, first = plan_module.outcomes_by_value(
            options, values, attempts_left=n, task_sd=sd, already_failed=failed
        )
        for v, s, c, f in zip(values, success, cost, first, strict=True):
            plan = best_plan(options, attempts_left=n, value=float(v), task_sd=sd, already_failed=failed)
            go = plan.worth_trying(float(v))
            assert f == (plan.models[0] if go else None)
            assert s == pytest.approx(plan.success if go else 0.0) and c == pytest.approx(
                plan.expected_cost if go else 0.0
            )


def test_older_artifacts_are_refused_with_retrain() -> None:
    obj = orjson.loads(fit(rows_for(20)).to_json())
    obj["format"] = "router-learned/1"
    with pytest.raises(ConfigError, match=r"router-learned/1.*retrain with `router train`"):
        Artifact.from_json(orjson.dumps(obj), source="a.json", expected_sha256=None)


def test_recommend_stops_when_another_attempt_is_not_worth_it() -> None:
    artifact = fit(rows_for(60))
    hard = task_vector("fix the race deadlock 999")
    # Worth a lot: after cheap failed, escalate to strong.
    rich = LearnedScorer(artifact, Objective(max_attempts=3, value=10.0))
    nxt = rich.recommend(hard, ["cheap", "strong"], attempt=2, failed=["cheap"])
    assert nxt.retry and nxt.model == "strong" and nxt.expected_cost_usd > 0
    # Worth less than strong's attempt costs: stop. And past the retry limit, always stop.
    poor = LearnedScorer(artifact, Objective(max_attempts=3, value=0.01))
    assert poor.recommend(hard, ["cheap", "strong"], attempt=2, failed=["cheap"]).retry is False
    assert rich.recommend(hard, ["cheap", "strong"], attempt=4, failed=["cheap", "strong"]).retry is False
