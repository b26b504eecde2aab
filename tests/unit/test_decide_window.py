"""The context-window rule per backend: a model that stops at its window (Claude from Sonnet 4.5
on) needs room for the prompt and a reply, not for the whole output limit the client sends."""

from __future__ import annotations

import pytest

from router.errors import ConfigError, ContextTooLarge
from router.policy.catalog import build_catalog, stops_at_window
from router.policy.decide import Decider
from router.policy.loading import parse_policy
from tests.unit.test_decide import feats

PRICES = "prices: {input: 3, output: 15}, context_window: 20000, max_output_tokens: 64000"
POLICY = f"""
models:
  - {{id: sonnet45, litellm_model: anthropic/claude-sonnet-4-5, protocol: anthropic, {PRICES}}}
  - {{id: sonnet4, litellm_model: anthropic/claude-sonnet-4-20250514, protocol: anthropic, {PRICES}}}
  - {{id: gpt, litellm_model: openai/gpt-5.4, protocol: openai, {PRICES}}}
  - {{id: gateway, litellm_model: openai/team-sonnet, protocol: openai, {PRICES}, stops_at_window: true}}
routes:
  - {{match: new, passthrough: sonnet45}}
  - {{match: old, passthrough: sonnet4}}
  - {{match: gpt, passthrough: gpt}}
  - {{match: gateway, passthrough: gateway}}
  - {{match: any, candidates: [sonnet4, sonnet45]}}
"""


@pytest.fixture
def decider() -> Decider:
    policy = parse_policy(POLICY, source="t.yaml", env={})
    return Decider(policy, build_catalog(policy, lookup=lambda m: None))


@pytest.mark.parametrize(
    ("model", "protocol", "stops"),
    [
        ("anthropic/claude-sonnet-4-5", "anthropic", True),
        ("anthropic/claude-sonnet-4-5-20250929", "anthropic", True),
        ("anthropic/claude-haiku-4-5-20251001", "anthropic", True),
        ("anthropic/claude-opus-4-6", "anthropic", True),
        ("anthropic/claude-sonnet-5", "anthropic", True),
        ("anthropic/claude-opus-4-1-20250805", "anthropic", False),
        ("anthropic/claude-sonnet-4-20250514", "anthropic", False),  # a date is not a minor version
        ("anthropic/claude-3-7-sonnet-20250219", "anthropic", False),
        ("anthropic/claude-sonnet-4-5", "openai", False),  # Anthropic's OpenAI endpoint: not said
        ("openrouter/anthropic/claude-sonnet-4.5", "openai", False),  # OpenRouter checks the sum itself
        ("openai/gpt-5.4", "openai", False),
        # The same models on Bedrock and Vertex, under the clouds' ids, reached through litellm.
        ("bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic", True),
        ("bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0", "openai", True),
        ("bedrock/converse/global.anthropic.claude-opus-4-6-v1", "openai", True),
        ("bedrock/anthropic.claude-opus-4-1-20250805-v1:0", "anthropic", False),
        ("bedrock/anthropic.claude-3-7-sonnet-20250219-v1:0", "anthropic", False),
        ("bedrock/amazon.nova-pro-v1:0", "openai", False),
        ("vertex_ai/claude-sonnet-4-5@20250929", "anthropic", True),
        ("vertex_ai/claude-opus-4-5", "openai", True),
        ("vertex_ai/claude-sonnet-4@20250514", "anthropic", False),
        ("vertex_ai/gemini-2.5-pro", "openai", False),
    ],
)
def test_which_models_stop_at_their_window(model: str, protocol: str, stops: bool) -> None:
    assert stops_at_window(model, protocol) is stops


def test_a_limit_past_the_window_is_served_by_a_model_that_stops_there(decider: Decider) -> None:
    # An agent asks for the model's largest output (64,000) whatever the prompt; 5k + 64k > the 20k window. The
    # router refused it (400 context_length_exceeded) though Sonnet 4.5 serves it, stopping at the window.
    d = decider.decide(feats(model="new", prompt=5000, max_output_tokens=64_000))
    assert d.chosen == "sonnet45" and d.estimate("sonnet45").excluded is None  # type: ignore[union-attr]
    assert decider.decide(feats(model="gateway", prompt=5000, max_output_tokens=64_000)).chosen == "gateway"
    # Among candidates, the one that would refuse it is excluded, as before.
    d = decider.decide(feats(model="any", prompt=5000, max_output_tokens=64_000))
    assert d.order == ["sonnet45"]
    assert d.estimate("sonnet4").excluded == "context: ~5000 prompt + 64000 output tokens > window 20000"  # type: ignore[union-attr]


@pytest.mark.parametrize("model", ["old", "gpt"])
def test_a_model_that_refuses_the_overflow_is_still_refused_it(decider: Decider, model: str) -> None:
    with pytest.raises(ContextTooLarge, match=r"64000 output tokens > window 20000"):
        decider.decide(feats(model=model, prompt=5000, max_output_tokens=64_000))
    assert decider.decide(feats(model=model, prompt=5000, max_output_tokens=15_000)).order == [
        {"old": "sonnet4", "gpt": "gpt"}[model]
    ]


def test_a_model_that_stops_at_its_window_still_needs_room_for_a_reply(decider: Decider) -> None:
    # The prompt must fit with the reserve (4,096 by default) a call with no limit gets, not only the prompt.
    assert decider.decide(feats(model="new", prompt=15_000, max_output_tokens=64_000)).chosen == "sonnet45"
    with pytest.raises(ContextTooLarge, match=r"~17000 prompt \+ room for 4096 output tokens > window 20000"):
        decider.decide(feats(model="new", prompt=17_000, max_output_tokens=64_000))
    # A limit below the reserve is what must fit, as anywhere.
    assert decider.decide(feats(model="new", prompt=17_000, max_output_tokens=2000)).chosen == "sonnet45"
    assert decider.size_matters(feats(model="new", max_output_tokens=64_000), 15_000, 17_000)
    assert not decider.size_matters(feats(model="new", max_output_tokens=64_000), 5_000, 15_000)


def test_the_catalog_knows_claude_on_bedrock_and_vertex_stops_at_its_window() -> None:
    # Only Anthropic's own ids were read: Sonnet 4.5 on Bedrock or Vertex was held to the prompt
    # plus the whole limit, and a client asking for its largest output was refused it there.
    clouds = f"""
models:
  - {{id: bedrock, litellm_model: bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0, protocol: openai, {PRICES}}}
  - {{id: vertex, litellm_model: vertex_ai/claude-sonnet-4-5@20250929, protocol: anthropic, {PRICES}}}
  - {{id: vertex41, litellm_model: vertex_ai/claude-opus-4-1@20250805, protocol: anthropic, {PRICES}}}
routes:
  - {{match: "*", candidates: [vertex41, vertex, bedrock]}}
"""
    policy = parse_policy(clouds, source="t.yaml", env={})
    catalog = build_catalog(policy, lookup=lambda m: None)
    assert [b.stops_at_window for b in catalog] == [True, True, False]
    d = Decider(policy, catalog).decide(feats(model="any", prompt=5000, max_output_tokens=64_000))
    assert sorted(d.order) == ["bedrock", "vertex"]
    assert d.estimate("vertex41").excluded == "context: ~5000 prompt + 64000 output tokens > window 20000"  # type: ignore[union-attr]


def test_the_policy_file_may_say_it_and_nothing_else() -> None:
    def given(value: str) -> str:
        return POLICY.replace("stops_at_window: true", f"stops_at_window: {value}")

    policy = parse_policy(given("false"), source="t.yaml", env={})
    assert not build_catalog(policy, lookup=lambda m: None)["gateway"].stops_at_window
    with pytest.raises(ConfigError, match="stops_at_window"):
        parse_policy(given("maybe"), source="t.yaml", env={})
