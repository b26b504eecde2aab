"""What is left of a budget bounds the decision, and a scope's decider only narrows (issue 30 #4, #5)."""

from __future__ import annotations

import random

import pytest

from router.http.admission import hold_of
from router.policy.catalog import build_catalog
from router.policy.decide import Decider
from router.policy.loading import parse_policy
from tests.unit.test_decide import POLICY, feats


def explorer(epsilon: float = 1.0, bound: str | None = None, policy: str = POLICY) -> Decider:
    spec = parse_policy(
        policy + f"objective: {{exploration: {{epsilon: {epsilon}}}}}\n", source="t.yaml", env={}
    )
    outer = parse_policy(bound, source="b.yaml", env={}) if bound is not None else None
    return Decider(spec, build_catalog(spec, lookup=lambda m: None), rng=random.Random(1), bound=outer)


@pytest.mark.parametrize("field", ["key_budget_left", "task_budget_left"])
def test_exploration_picks_only_among_candidates_the_budget_left_fits(field: str) -> None:
    d = explorer()
    # ~1,000 prompt + 1,024 output tokens: cheap ~$0.0005, mid ~$0.005, big ~$0.018.
    chosen = {d.decide(feats(**{field: 0.01})).chosen for _ in range(200)}
    assert chosen == {"cheap", "mid"}
    decision = d.decide(feats(**{field: 0.01}))
    big = decision.estimate("big")
    assert big is not None and big.excluded is not None and big.excluded.startswith("budget:")
    # Uniform among the two that fit: the propensity is what off-policy evaluation divides by.
    assert decision.propensity == pytest.approx(0.5)


def test_the_lower_of_the_key_and_task_budgets_bounds_it() -> None:
    d = explorer(epsilon=0.0)
    assert d.decide(feats(key_budget_left=1.0, task_budget_left=0.001)).order[0] == "cheap"
    assert {d.decide(feats(key_budget_left=0.001, task_budget_left=1.0)).chosen for _ in range(20)} == {
        "cheap"
    }


def test_when_nothing_fits_the_cheapest_goes_to_admission() -> None:
    d = explorer()
    decision = d.decide(feats(key_budget_left=0.0001, pinned="big"))
    assert decision.chosen == "cheap" and decision.reason.startswith("no candidate fits the budget left")
    assert all(e.excluded is None for e in decision.candidates)
    # Admission holds, and its refusal quotes, the cheapest's cost: the whole order held the dearest's.
    assert decision.order == ["cheap"]
    assert hold_of(decision) == decision.estimate("cheap").hold_usd  # type: ignore[union-attr]


BOUND = POLICY.replace(
    "- {match: auto, candidates: [cheap, mid, big]}", "- {match: auto, candidates: [cheap, mid]}"
)
SCOPED = POLICY.replace(
    "- {match: auto, candidates: [cheap, mid, big]}", "- {match: auto, candidates: [big, mid]}"
)


def test_a_scope_decides_only_among_what_the_policy_allows() -> None:
    d = explorer(epsilon=0.0, bound=BOUND, policy=SCOPED)
    decision = d.decide(feats())
    assert decision.order == ["mid"]
    big = decision.estimate("big")
    assert big is not None and big.excluded == "scope: not a backend the policy allows for 'auto'"
    # The policy's own rules bound it too: premium leaves only big, which the route does not allow.
    with pytest.raises(Exception, match="no backend can serve"):
        d.decide(feats(model="auto", headers={"x-tier": "premium"}))
