"""The decision at this stage: route → rules → hard constraints → cheapest, with reasons."""

from __future__ import annotations

import pytest

from router.errors import BadRequest, ContextTooLarge, UnknownModel
from router.features.request import Features
from router.policy.catalog import build_catalog
from router.policy.decide import Decider
from router.policy.loading import parse_policy

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


def test_unknown_model_says_what_to_ask_for(decider: Decider) -> None:
    # It said only "see GET /v1/models": an agent set up with a provider's model name learned
    # what to ask for with a second request.
    with pytest.raises(UnknownModel) as exc:
        decider.decide(feats(model="gpt-99"))
    assert (
        str(exc.value)
        == "model 'gpt-99' is not served here; ask for one of: auto, claude-*, pinned (GET /v1/models)"
    )


def test_a_backend_no_route_serves_says_so(decider: Decider) -> None:
    # GET /v1/models lists it, and the 404 said "not served here; see GET /v1/models for the names".
    assert decider.policy.route_for("cheap") is None and "cheap" in decider.catalog.backends
    with pytest.raises(UnknownModel) as exc:
        decider.decide(feats(model="cheap"))
    assert str(exc.value) == (
        "model 'cheap' is a backend of this policy, but no route serves that name: ask for a route's "
        "name, or add `- {match: cheap, passthrough: cheap}` to the policy's routes"
    )


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
    # It said "preferred by rule", not which one: the console, the log and /ui alike.
    assert d.order[0] == "big" and d.reason.startswith("preferred by rule thinking-on-big; then ")
    # The rule does not fire for the other protocol.
    assert decider.decide(feats(thinking=True)).chosen == "cheap"


def test_passthrough_and_fallbacks(decider: Decider) -> None:
    passthrough = decider.decide(feats(model="pinned"))
    assert passthrough.order == ["mid", "big"]
    # The log and the console said "cheapest expected cost among the candidates that fit".
    assert (passthrough.reason, passthrough.propensity) == ("passthrough route", 1.0)
    assert decider.decide(feats(model="claude-x")).order == ["notools", "cheap", "big", "mid"]
    assert decider.decide(feats(model="claude-x")).reason.startswith("cheapest expected cost")


# -- size_matters: when an estimated prompt size must be counted before deciding -----------------


@pytest.fixture
def sized() -> Decider:
    rule = """
  - name: long-prompts-on-big
    when: {prompt_tokens: {$gt: 50000}}
    only: [big]
"""
    policy = parse_policy(POLICY + rule, source="t.yaml", env={})
    return Decider(policy, build_catalog(policy, lookup=lambda m: None))


def test_size_matters_when_a_rule_threshold_lies_between_the_bounds(sized: Decider) -> None:
    assert sized.size_matters(feats(prompt=30_000), 30_000, 60_000)
    assert not sized.size_matters(feats(prompt=60_000), 55_000, 60_000)
    assert not sized.size_matters(feats(prompt=30_000), 20_000, 40_000)


def test_size_matters_when_a_context_window_lies_between_the_bounds(decider: Decider) -> None:
    # cheap: 16k window, the 4k output reserve counted (as decide does).
    assert decider.size_matters(feats(prompt=10_000), 10_000, 14_000)
    assert not decider.size_matters(feats(prompt=10_000), 10_000, 11_000)
    # mid (128k) and big (200k): between them only when both bounds are past cheap's.
    assert decider.size_matters(feats(prompt=130_000), 120_000, 130_000)
    assert not decider.size_matters(feats(prompt=100_000), 90_000, 110_000)


def test_size_matters_checks_fallbacks_and_passthrough(decider: Decider) -> None:
    # pinned: passthrough mid (128k), fallback big (200k, no output reserve for fallbacks).
    assert decider.size_matters(feats(model="pinned", prompt=150_000), 150_000, 210_000)
    assert not decider.size_matters(feats(model="pinned", prompt=150_000), 150_000, 190_000)


def test_size_never_matters_for_exact_sizes_or_unknown_models(decider: Decider) -> None:
    assert not decider.size_matters(feats(prompt=16_000), 16_000, 16_000)
    assert not decider.size_matters(feats(model="gpt-99"), 0, 10**9)


def test_a_decision_on_either_bound_agrees_when_size_does_not_matter(sized: Decider) -> None:
    for low, high in ((1_000, 3_000), (20_000, 45_000), (60_000, 120_000), (130_000, 190_000)):
        f = feats(prompt=low)
        assert not sized.size_matters(f, low, high)
        a, b = sized.decide(feats(prompt=low)), sized.decide(feats(prompt=high))
        assert a.rules_applied == b.rules_applied
        assert [e.excluded is None for e in a.candidates] == [e.excluded is None for e in b.candidates]
        assert a.order == b.order


def exploring(share: float) -> Decider:
    policy = parse_policy(
        POLICY + f"objective: {{exploration: {{epsilon: {share}, seed: 3}}}}\n", source="t.yaml", env={}
    )
    return Decider(policy, build_catalog(policy, lookup=lambda m: None))


def test_an_explored_choice_says_so_and_names_the_policys_own() -> None:
    decider = exploring(1.0)  # every attempt's first model drawn at random among the three
    decisions = [decider.decide(feats()) for _ in range(60)]
    explored = [d for d in decisions if d.explored]
    assert {d.chosen for d in explored} == {"mid", "big"}  # the draws that differ from the policy's
    for d in explored:
        assert d.reason.startswith("explored (epsilon 1.0); the policy chose cheap: cheapest")
        assert d.propensity == pytest.approx(1 / 3)
    # A draw of the policy's own choice is no exploration: no label, its propensity that of the choice.
    same = [d for d in decisions if d.chosen == "cheap"]
    assert same and all(not d.explored and d.reason.startswith("cheapest") for d in same)
    assert all(d.propensity == pytest.approx(1 / 3) for d in same)


def test_a_look_at_the_decision_does_not_explore_nor_draw_from_the_sequence() -> None:
    looking, alone = exploring(1.0), exploring(1.0)
    for _ in range(20):
        d = looking.decide(feats(), explore=False)
        assert (d.chosen, d.explored, d.propensity) == ("cheap", False, 1.0)
    # The seeded sequence is where it was: the next real decisions are those of a fresh decider.
    assert [looking.decide(feats()).chosen for _ in range(10)] == [
        alone.decide(feats()).chosen for _ in range(10)
    ]


def test_a_rule_that_decides_the_front_is_not_called_exploration() -> None:
    decider = exploring(1.0)
    for _ in range(20):
        d = decider.decide(feats(protocol="anthropic", thinking=True))
        assert (
            d.chosen == "big"
            and not d.explored
            and d.reason.startswith("preferred by rule thinking-on-big; then cheapest")
        )


def test_a_hosted_tool_holds_the_policys_calls_or_the_fewer_the_request_allows() -> None:
    """``defaults.held_tool_calls`` of each declared hosted tool, unless its ``max_uses`` allows
    fewer: a request allowing one search held three."""
    policy = parse_policy(POLICY + "defaults: {held_tool_calls: 3}\n", source="t.yaml", env={})
    decider = Decider(policy, build_catalog(policy, lookup=lambda m: None))

    def tools_held(**kw) -> float:  # type: ignore[no-untyped-def]
        est = decider.decide(feats(hosted_tools=("web_search", "web_fetch"), **kw)).estimate("big")
        assert est is not None and est.hold_usd is not None
        return est.hold_usd - decider.decide(feats()).estimate("big").hold_usd  # type: ignore[union-attr,operator]

    fee = build_catalog(policy, lookup=lambda m: None)["big"].price.tools({"web_search": 1})
    assert tools_held() == pytest.approx(3 * fee)
    assert tools_held(hosted_max_uses=(("web_search", 1),)) == pytest.approx(fee)
    assert tools_held(hosted_max_uses=(("web_search", 5),)) == pytest.approx(3 * fee)


def test_a_hosted_tools_worst_case_is_the_requests_cap_else_the_policys_most_calls() -> None:
    """What a key's budget holds at most counts every call a hosted tool may make: its ``max_uses``,
    or, uncapped, ``defaults.worst_tool_calls``; it counted the tokens alone, so a request that
    searched four times held one search's fee in the key's budget."""
    policy = parse_policy(POLICY + "defaults: {held_tool_calls: 3}\n", source="t.yaml", env={})
    decider = Decider(policy, build_catalog(policy, lookup=lambda m: None))
    fee = build_catalog(policy, lookup=lambda m: None)["big"].price.tools({"web_search": 1})
    plain = decider.decide(feats()).estimate("big")
    assert plain is not None and plain.worst_usd is not None

    def tools_worst(**kw) -> float:  # type: ignore[no-untyped-def]
        est = decider.decide(feats(hosted_tools=("web_search",), **kw)).estimate("big")
        assert est is not None and est.worst_usd is not None and est.hold_usd is not None
        assert est.hold_usd <= est.worst_usd
        return est.worst_usd - plain.worst_usd  # type: ignore[operator]

    assert tools_worst() == pytest.approx(10 * fee)
    assert tools_worst(hosted_max_uses=(("web_search", 1),)) == pytest.approx(fee)
    assert tools_worst(hosted_max_uses=(("web_search", 25),)) == pytest.approx(25 * fee)
    fewer = parse_policy(POLICY + "defaults: {worst_tool_calls: 2}\n", source="t.yaml", env={})
    decision = Decider(fewer, build_catalog(fewer, lookup=lambda m: None)).decide(
        feats(hosted_tools=("web_search",))
    )
    assert decision.estimate("big").worst_usd == pytest.approx(plain.worst_usd + 2 * fee)  # type: ignore[union-attr]


def test_a_chat_completions_backend_holds_no_hosted_tools_fee(decider: Decider) -> None:
    """Codex declares ``web_search`` in every request: each held its $0.01 fee on a Chat
    Completions backend too, which runs no hosted tool and whose replies show none to charge, and
    a task budget of $0.01 refused Codex's first request (a new user's first hour)."""
    searching = decider.decide(feats(hosted_tools=("web_search",)))
    plain = decider.decide(feats())
    for model in ("cheap", "mid"):  # protocol: openai
        assert searching.estimate(model) == plain.estimate(model)
    big, bare = searching.estimate("big"), plain.estimate("big")  # Anthropic runs it
    assert big is not None and bare is not None and big.hold_usd > bare.hold_usd  # type: ignore[operator]


def test_a_switch_names_the_model_it_left_and_why(decider: Decider) -> None:
    # A tool loop on the pinned model: the next cheapest serves, and the reason says the switch
    # (the console showed only "cheapest ...", as if nothing had happened).
    d = decider.decide(feats(pinned="cheap", switch_reason="tool_loop"))
    assert d.chosen == "mid" and d.estimate("cheap").excluded == "switch: tool_loop"  # type: ignore[union-attr]
    assert d.reason.startswith("left cheap (tool_loop); then cheapest"), d.reason
    # Pinned and not told to switch: the pin, as before.
    assert decider.decide(feats(pinned="cheap")).reason == "pinned to cheap for attempt 1"


def test_a_second_switch_goes_on_not_back_to_a_model_the_attempt_left(decider: Decider) -> None:
    # cheap looped, mid took over and loops too: big, not cheap again.
    d = decider.decide(feats(pinned="mid", switch_reason="tool_loop", left_models=("cheap",)))
    assert d.chosen == "big", d.order
    assert d.estimate("cheap").excluded == "switch: left earlier in this attempt"  # type: ignore[union-attr]
    # With no other model left to take it, back is better than refusing the request.
    only = decider.decide(feats(pinned="mid", switch_reason="tool_loop", left_models=("cheap", "big")))
    assert only.chosen == "cheap", only.order
