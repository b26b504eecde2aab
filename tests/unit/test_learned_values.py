"""The learned scorer (router.policy.learned) on a hand-made artifact whose answers are known by hand:
every weight is zero but each model's Platt offset and cost, so P(success) = σ(offset) and an
attempt costs exactly what its cost weight says, whatever the task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.errors import ConfigError
from router.features.request import Features
from router.features.task import vector as taskfeatures
from router.learning.training import dataset
from router.learning.training.fit import fit
from router.policy.artifact import FORMAT, Artifact, ModelParams, OutputTokens
from router.policy.decide import Estimate
from router.policy.learned import TYPICAL_CALLS, LearnedScorer, Objective
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
    return Artifact(models=params, task_sd=task_sd)


def every_attempt_worth_making(max_attempts: int) -> Objective:
    """A task worth so much that more success is always worth its cost: a plan uses every attempt
    it may."""
    return Objective(max_attempts=max_attempts, value=1e6)


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
    # Of two known models the upper one (0.2 rather than 0.01): an unseen model is not assumed cheap.
    two = {o.model: o for o in scorer.options(TASK, ["cheap", "strong", "new"])}
    assert two["new"] == Option("new", 0.5, pytest.approx(0.2))
    # An artifact that knows none of the candidates: their call estimates, else nothing to go by.
    blind = LearnedScorer(artifact({"retired": (0.5, 0.01)}), Objective())
    none_known = blind.options(TASK, ["new", "newer"], per_call_cost={"newer": 0.001})
    assert none_known == [Option("new", 0.5, 0.0), Option("newer", 0.5, pytest.approx(0.001 * TYPICAL_CALLS))]


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


def test_the_first_attempt_by_default_and_the_objectives_cost_limit() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    assert scorer.plan(TASK, list(MODELS))[0].models == ("cheap", "mid", "strong")  # three attempts left
    # The objective's limit per task holds when the request brings no budget of its own.
    capped = LearnedScorer(artifact(), Objective(max_attempts=1, value=1e6, max_cost_per_task=0.06))
    assert capped.choose(TASK, list(MODELS)).plan.models == ("mid",)
    assert capped.choose(TASK, list(MODELS), budget=0.3).plan.models == ("strong",)  # the request's own


def test_a_task_effect_makes_later_attempts_less_likely_to_succeed() -> None:
    """Failures of one task are correlated: mid then strong completes less than independence says
    (1 − 0.5·0.2 = 0.9), and no less than strong alone (0.8)."""
    scorer = LearnedScorer(artifact(task_sd=1.0), every_attempt_worth_making(max_attempts=2))
    plan = scorer.choose(TASK, list(MODELS)).plan
    assert plan.models == ("mid", "strong")
    assert 0.8 < plan.success < 0.9 - 0.01


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


def features(**task: Any) -> Features:
    return Features(
        protocol="openai_chat", requested_model="auto", prompt_tokens=100, max_output_tokens=None,
        tools=True, n_tools=1, thinking=False, vision=False, stream=False, n_messages=3, **task,
    )  # fmt: skip


def estimates(per_call: dict[str, float]) -> list[Estimate]:
    return [Estimate(m, 100, 10, 0, cost) for m, cost in per_call.items()]


def test_rank_puts_the_plans_first_model_first_and_explains_the_plan() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    # Per-call costs in the opposite order of the artifact's: the plan, not the call, decides.
    ranked, propensity, reason = scorer.rank(
        features(task_vector=TASK), estimates({"strong": 0.001, "mid": 0.002, "cheap": 0.003})
    )
    assert [e.model for e in ranked] == ["cheap", "mid", "strong"]  # first, then by cost per success
    assert propensity == 1.0
    assert reason == "plan cheap → mid → strong: expected $0.1237 per completed task, success 93%"
    by_model = {e.model: e for e in ranked}
    assert (by_model["cheap"].p_success, by_model["cheap"].attempt_cost_usd) == (0.3, 0.01)
    # 0.01 / 0.3, 0.05 / 0.5, 0.2 / 0.8
    assert [by_model[m].score for m in ("cheap", "mid", "strong")] == [0.033333, 0.1, 0.25]
    assert all(e.score == e.cost_per_completed_usd for e in ranked)


def test_rank_plans_from_the_tasks_attempt_failures_and_budget() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    cost = estimates({"strong": 0.001, "mid": 0.002, "cheap": 0.003})
    last = scorer.rank(features(task_vector=TASK, attempt=3, failed_models=("cheap", "mid")), cost)
    assert last[0][0].model == "strong" and last[2].startswith("plan strong: ")
    broke = scorer.rank(features(task_vector=TASK, attempt=3, task_budget_left=0.06), cost)
    assert broke[2].startswith("plan mid: ")
    # One attempt left, strong already failed: mid (0.5) before strong again (0.8·0.35).
    again = scorer.rank(features(task_vector=TASK, attempt=3, failed_models=("strong",)), cost)
    assert again[2].startswith("plan mid: ")


def test_rank_prices_a_model_the_log_has_not_seen_by_its_call() -> None:
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=1))
    ranked, _, reason = scorer.rank(features(task_vector=TASK), estimates({"strong": 0.001, "new": 0.0001}))
    new = next(e for e in ranked if e.model == "new")
    # An even chance at 20 calls of $0.0001: $0.002 an attempt, $0.004 per completed task.
    assert (new.p_success, new.attempt_cost_usd, new.score) == (0.5, 0.002, 0.004)
    assert reason.startswith("plan strong: ")  # 0.8 − 0.2 is worth more than 0.5 − 0.002 at V = 1e6


def test_rank_without_a_task_is_the_cheapest_call() -> None:
    # (Side calls never reach the scorer: the decider ranks them by cost; test_side_calls.py.)
    scorer = LearnedScorer(artifact(), every_attempt_worth_making(max_attempts=3))
    ranked, _, reason = scorer.rank(features(), estimates({"strong": 0.001, "mid": 0.002, "cheap": 0.003}))
    assert [e.model for e in ranked] == ["strong", "mid", "cheap"]
    assert reason.startswith("cheapest")


def test_artifact_load_checks_the_pinned_hash(tmp_path: Path) -> None:
    good = tmp_path / "artifact.json"
    good.write_bytes(fit(training_rows()).to_json())
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    assert Artifact.load(good, digest).sha256 == digest
    assert Artifact.load(good, digest.upper()).sha256 == digest
    with pytest.raises(ConfigError, match="sha256 mismatch"):
        Artifact.load(good, "0" * 64)
    with pytest.raises(ConfigError, match=r"missing\.json: cannot read learned artifact"):
        Artifact.load(tmp_path / "missing.json", None)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"{not json")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bad))}: not JSON"):
        Artifact.load(bad, None)
    # The scorer is named after the file it uses (the log's policy column shows it).
    assert LearnedScorer(Artifact.load(good, digest), Objective()).name == f"learned:{digest[:12]}"


def training_rows() -> list[dataset.AttemptRow]:
    vec = taskfeatures.task_vector("fix the failing test")
    return [
        dataset.AttemptRow(f"t{i}", 1, m, vec, m == "strong", "explicit", 0.01, 3, 1.0, [m])
        for i in range(6)
        for m in ("cheap", "strong")
    ]


def test_expected_output_from_the_fitted_median() -> None:
    art = dataclasses.replace(artifact(), output_tokens={"mid": OutputTokens((1.0, 0.5), (2.0, 0.5))})
    scorer = LearnedScorer(art, Objective())
    # log1p(out) = 1 + 0.5 · log1p(99) → out = e^(1 + 0.5 ln 100) − 1 = 10e − 1
    assert scorer.expected_output("mid", 99) == round(10 * math.e - 1)
    assert scorer.expected_output("cheap", 99) is None
    # A fitted median below one token (e^-5 − 1 < 0) is still a call that answers: one token.
    tiny = dataclasses.replace(artifact(), output_tokens={"mid": OutputTokens((-5.0, 0.0), (0.0, 0.0))})
    assert LearnedScorer(tiny, Objective()).expected_output("mid", 99) == 1


def artifact_json(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "format": FORMAT,
        "feature_schema": taskfeatures.schema(),
        "models": {"m": {"weights": [0.0] * WIDTH, "platt": [2, -1], "cost_weights": [-3]}},
        "task_effect_sd": 1.5,
        "trained_on": 42,
    }
    obj.update(changes)
    return obj


def test_artifact_is_read_field_by_field() -> None:
    art = Artifact.from_json(orjson.dumps(artifact_json()), source="a.json", expected_sha256=None)
    m = art.models["m"]
    assert (m.platt, m.cost_weights, m.calls_per_attempt, m.n) == ((2.0, -1.0), (-3.0,), 1.0, 0)
    assert art.task_sd == 1.5 and art.report == {"trained_on": 42}
    assert art.schema == taskfeatures.schema()
    assert m.p_success(TASK) == pytest.approx(1 / (1 + math.e))  # σ(2·0 − 1)
    assert m.attempt_cost(TASK) == pytest.approx(math.exp(-3))
    sure = {"weights": [0.0] * WIDTH, "platt": [1, 2], "cost_weights": [0], "calls_per_attempt": 12.5, "n": 7}
    art = Artifact.from_json(
        orjson.dumps(artifact_json(models={"m": sure})), source="a.json", expected_sha256=None
    )
    m = art.models["m"]
    assert (m.calls_per_attempt, m.n) == (12.5, 7)
    assert m.p_success(TASK) == pytest.approx(1 / (1 + math.exp(-2)))  # σ(1·0 + 2), a positive logit
    # An artifact that measured no task effect: failures independent. The largest spread is allowed.
    plain = artifact_json()
    del plain["task_effect_sd"]
    assert Artifact.from_json(orjson.dumps(plain), source="a.json", expected_sha256=None).task_sd == 0.0
    widest = Artifact.from_json(
        orjson.dumps(artifact_json(task_effect_sd=10)), source="a", expected_sha256=None
    )
    assert widest.task_sd == 10.0


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (b"{not json", r"^a\.json: not JSON: "),
        (orjson.dumps([1]), r"^a\.json: not a learned-policy artifact \(format 'router-learned/"),
        (orjson.dumps(artifact_json(format="router-learned/0")), r"artifact format 'router-learned/0', this"),
        # The last format without prior plans: refused, saying to retrain.
        (orjson.dumps(artifact_json(format="router-learned/2")), r"'router-learned/2'.*prior plan.*retrain"),
        (
            orjson.dumps(artifact_json(prior_plans={"2": [["m", 0.5]]})),
            r"^a\.json: prior_plans\.2\[0\]: expected a list of 3, got a list of 2$",
        ),
        (
            orjson.dumps(artifact_json(operating_points={"2": [{"value": 1}]})),
            r"^a\.json: operating_points\.2\[0\]\.success: missing$",
        ),
        (
            orjson.dumps(artifact_json(feature_schema={"version": 0})),
            r"^a\.json: feature schema mismatch: artifact has \{'version': 0\}, this router computes \{",
        ),
        (
            orjson.dumps(artifact_json(scopes={"acme": {"common": 1}})),
            r"^a\.json: scopes\.acme\.match: missing$",
        ),
        (
            orjson.dumps(
                artifact_json(models={"m": {"weights": [0.0], "platt": [1, 0], "cost_weights": []}})
            ),
            rf"^a\.json: models\.m\.weights: expected {WIDTH} values, got 1$",
        ),
        (
            orjson.dumps(artifact_json(task_effect_sd=11)),
            r"task_effect_sd: expected a number in \[0, 10\], got 11",
        ),
        (orjson.dumps(artifact_json(task_effect_sd="1")), r"task_effect_sd: expected a number"),
    ],
)
def test_artifact_refusals_name_the_file_and_the_field(obj: bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Artifact.from_json(obj, source="a.json", expected_sha256=None)


def test_after_a_failure_the_policy_recommends_escalating_or_stopping() -> None:
    valuable = LearnedScorer(artifact(), Objective(max_attempts=3, value=1e6))
    # cheap failed; two attempts left: mid then strong (1 − 0.5·0.2 = 0.9 for 0.05 + 0.5·0.2).
    go = valuable.recommend(TASK, list(MODELS), attempt=2, failed=("cheap",))
    assert go.as_dict() == {"retry": True, "model": "mid", "expected_success": 0.9, "expected_cost_usd": 0.15}
    # A task worth a cent: no attempt pays for itself (cheap: 0.01·0.3 < 0.01), so stop.
    cheap_task = LearnedScorer(artifact(), Objective(max_attempts=3, value=0.01))
    stop = cheap_task.recommend(TASK, list(MODELS), attempt=2, failed=("cheap",))
    assert stop.as_dict() == {
        "retry": False,
        "model": None,
        "expected_success": 0.0,
        "expected_cost_usd": 0.0,
    }
    # No attempts left, whatever the task is worth.
    past = valuable.recommend(TASK, list(MODELS), attempt=4, failed=("cheap",))
    assert past.as_dict() == {
        "retry": False,
        "model": None,
        "expected_success": 0.0,
        "expected_cost_usd": 0.0,
    }
    assert valuable.recommend(TASK, list(MODELS), attempt=3, failed=("cheap",)).model == "strong"
    # The task's budget left bounds the recommendation as it bounds the plan: mid fits $0.06, strong not.
    poor = valuable.recommend(TASK, list(MODELS), attempt=3, failed=("cheap",), budget=0.06)
    assert (poor.retry, poor.model) == (True, "mid")


def test_the_artifacts_estimates_reach_the_decision() -> None:
    from router.policy.catalog import build_catalog
    from router.policy.decide import Decider
    from router.policy.loading import parse_policy

    learned = {"m": {"tokens_ratio": 1.25, "output_mean": 300.0, "output_p90": 900.0, "cache_share": 0.5}}
    art = Artifact.from_json(
        orjson.dumps(artifact_json(estimates=learned)), source="a.json", expected_sha256=None
    )
    policy = parse_policy(
        "models:\n  - {id: m, litellm_model: openai/m, protocol: openai, prices: {input: 1, output: 2},"
        " context_window: 100000, max_output_tokens: 4000}\nroutes:\n  - {match: auto, candidates: [m]}\n",
        source="p.yaml", env={},
    )  # fmt: skip
    d = Decider(policy, build_catalog(policy, lookup=lambda m: None), LearnedScorer(art, Objective()))
    f = Features(
        "openai_chat",
        "auto",
        1_000,
        None,
        False,
        0,
        False,
        False,
        False,
        2,
        warm_model="m",
        warm_tokens=1_000,
        prompt_anchor=0,  # all of it in o200k tokens
    )
    e = d.decide(f).estimate("m")
    # Half of the warm prefix's whole 128-token blocks (7 of its 1,000 tokens) cached.
    assert e is not None and (e.prompt_tokens, e.output_tokens, e.cached_tokens) == (1_250, 300, 448)
    with pytest.raises(ConfigError, match=r"a\.json: estimates\.m\.tokens_ratio"):
        Artifact.from_json(orjson.dumps(artifact_json(estimates={"m": {"tokens_ratio": "x"}})), source="a.json",
                            expected_sha256=None)  # fmt: skip
