"""The decision at this stage: route → rules → hard constraints → cheapest, with reasons."""

from __future__ import annotations

import pytest

from router.catalog import build_catalog
from router.errors import BadRequest, ContextTooLarge, UnknownModel
from router.features import Features
from router.policy.config import parse_policy
from router.policy.decide import Decider

POLICY = """
models:
  - {id: cheap, litellm_model: openai/c, protocol: openai, prices: {input: 0.1, output: 0.4},
     context_window: 16000, max_output_tokens: 4000}
  - {id: mid, litellm_model: openai/m, protocol: openai, prices: {input: 1, output: 4},
     context_window: 128000, max_output_tokens: 16000, capabilities: {vision: true}}
  - {id: big, litellm_model: anthropic/b, protocol: anthropic, prices: {input: 3, output: 15},
     context_window: 200000, max_output_tokens: 64000, capabilities: {tools: true, vision: true, thinking: true}}
  - {id: notools, litellm_model: openai/n, protocol: openai, prices: {input: 0.01, output: 0.01},
     context_window: 8000, capabilities: {tools: false}}
routes:
  - {match: auto, candidates: [cheap, mid, big]}
  - {match: "claude-*", candidates: [notools, cheap, big], fallbacks: [mid]}
  - {match: pinned, passthrough: mid, fallbacks: [big]}
rules:
  - name: premium
    when: {headers.x-tier: premium}
    only: [big]
  - name: thinking-on-big
    when: {$and: [{thinking: true}, {protocol: anthropic}]}
    prefer: [big]
"""


@pytest.fixture
def decider() -> Decider:
    policy = parse_policy(POLICY, source="t.yaml", env={})
    return Decider(policy, build_catalog(policy, lookup=lambda m: None))


def feats(model: str = "auto", prompt: int = 1000, **kw) -> Features:  # type: ignore[no-untyped-def]
    base = dict(protocol="openai_chat", requested_model=model, prompt_tokens=prompt, max_output_tokens=None,
                tools=False, n_tools=0, thinking=False, vision=False, stream=False, n_messages=1)  # fmt: skip
    base.update(kw)
    return Features(**base)  # type: ignore[arg-type]


def test_cheapest_that_fits_first_then_the_rest_by_cost(decider: Decider) -> None:
    d = decider.decide(feats())
    assert d.order == ["cheap", "mid", "big"]
    assert d.propensity == 1.0 and d.reason.startswith("cheapest")
    costs = [d.estimate(m).cost_usd for m in d.order]  # type: ignore[union-attr]
    assert costs == sorted(costs)


def test_context_window_counts_requested_output(decider: Decider) -> None:
    # 14k prompt + 4k requested output > cheap's 16k window.
    d = decider.decide(feats(prompt=14_000, max_output_tokens=4000))
    assert d.chosen == "mid"
    assert d.estimate("cheap").excluded.startswith("context")  # type: ignore[union-attr]
    assert decider.decide(feats(prompt=10_000, max_output_tokens=4000)).chosen == "cheap"


def test_nothing_fits_is_context_too_large(decider: Decider) -> None:
    with pytest.raises(ContextTooLarge, match="big: context"):
        decider.decide(feats(prompt=300_000))


def test_unknown_model(decider: Decider) -> None:
    with pytest.raises(UnknownModel):
        decider.decide(feats(model="gpt-99"))


def test_capabilities_exclude(decider: Decider) -> None:
    d = decider.decide(feats(model="claude-x", tools=True, n_tools=1, protocol="anthropic"))
    assert d.estimate("notools").excluded == "capability: no tool use"  # type: ignore[union-attr]
    assert d.chosen == "cheap"
    d = decider.decide(feats(vision=True))
    assert d.order[0] == "mid"
    assert d.estimate("cheap").excluded == "capability: no image input"  # type: ignore[union-attr]


def test_nothing_capable_is_a_bad_request() -> None:
    policy = parse_policy(POLICY.replace("[notools, cheap, big]", "[notools]").replace("fallbacks: [mid]", ""),
                          source="t.yaml", env={})  # fmt: skip
    decider = Decider(policy, build_catalog(policy, lookup=lambda m: None))
    with pytest.raises(BadRequest, match="notools: capability: no tool use"):
        decider.decide(feats(model="claude-x", tools=True, n_tools=1))


def test_rules_only_and_prefer(decider: Decider) -> None:
    d = decider.decide(feats(headers={"x-tier": "premium"}))
    assert d.order == ["big"] and d.rules_applied == ["premium"]
    assert d.estimate("cheap").excluded == "rule premium"  # type: ignore[union-attr]
    d = decider.decide(feats(model="claude-x", thinking=True, protocol="anthropic"))
    assert d.order[0] == "big" and "preferred by rule" in d.reason
    # The rule does not fire for the other protocol.
    assert decider.decide(feats(thinking=True)).chosen == "cheap"


def test_passthrough_and_fallbacks(decider: Decider) -> None:
    assert decider.decide(feats(model="pinned")).order == ["mid", "big"]
    assert decider.decide(feats(model="claude-x")).order == ["notools", "cheap", "big", "mid"]
