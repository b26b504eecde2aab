"""What a request holds and what it may cost at most, over many random decisions: for every
candidate, its hold and its expected cost are within its worst case, and so is what the billing
code charges for a reply that writes all the output it may and calls each hosted tool as often as
it may (``Estimate.worst_usd``, which a key's budget holds up to of what it has left)."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.features.request import Features
from router.forward.accounting import cost_split
from router.http.admission import hold_of, worst_of
from router.policy.catalog import Backend, build_catalog
from router.policy.decide import Decider
from router.policy.estimates import BackendEstimates, Estimates
from router.policy.loading import parse_policy
from router.protocols import Usage
from router.store.records import Estimate

KINDS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
         "web_fetch", "code_execution")  # fmt: skip
PROTOCOLS = ("openai", "anthropic", "openai_responses")


@st.composite
def backends(draw: st.DrawFn, i: int) -> dict[str, Any]:
    per_million = st.floats(0.0, 100.0, allow_nan=False)
    input_ = draw(per_million)
    return {
        "id": f"m{i}", "litellm_model": f"openai/m{i}", "protocol": draw(st.sampled_from(PROTOCOLS)),
        "context_window": 10_000_000, "max_output_tokens": draw(st.integers(1, 200_000)),
        "prices": {"input": input_, "output": draw(per_million), "cache_read": draw(st.floats(0.0, input_)),
                   "cache_write": draw(st.floats(input_, 2 * input_ + 1))},
    }  # fmt: skip


@st.composite
def situations(draw: st.DrawFn) -> tuple[Decider, Features]:
    models = [draw(backends(i)) for i in range(draw(st.integers(1, 3)))]
    ids = [m["id"] for m in models]
    defaults = {"expected_output_tokens": draw(st.integers(1, 20_000)),
                "held_tool_calls": draw(st.integers(0, 5)), "worst_tool_calls": draw(st.integers(0, 20))}  # fmt: skip
    policy = parse_policy(
        yaml.safe_dump({"models": models, "routes": [{"match": "auto", "candidates": ids}], "defaults": defaults}),
        source="t.yaml", env={},
    )  # fmt: skip
    learned = {
        m: BackendEstimates(
            output_mean=draw(st.floats(1.0, 50_000.0)),
            output_p90=draw(st.floats(1.0, 100_000.0)),
            cache_share=draw(st.floats(0.0, 1.0)),
        )
        for m in ids
        if draw(st.booleans())
    }
    decider = Decider(policy, build_catalog(policy, lookup=lambda m: None), estimates=Estimates(learned))
    hosted = tuple(draw(st.lists(st.sampled_from(KINDS), unique=True, max_size=3)))
    prompt = draw(st.integers(1, 500_000))
    features = Features(
        protocol="openai_chat", requested_model="auto", prompt_tokens=prompt,
        max_output_tokens=draw(st.none() | st.integers(1, 300_000)), tools=False, n_tools=0, thinking=False,
        vision=False, stream=False, n_messages=3, warm_model=draw(st.sampled_from(ids)),
        warm_tokens=draw(st.integers(0, prompt)), hosted_tools=hosted,
        hosted_max_uses=tuple((k, draw(st.integers(0, 30))) for k in hosted if draw(st.booleans())),
    )  # fmt: skip
    return decider, features


def at_the_cap(backend: Backend, e: Estimate, features: Features, decider: Decider) -> float:
    """What the billing code charges a reply on ``backend`` that writes all the output it may and
    makes every hosted call the request allows (the policy's most where it sets no cap), with the
    prompt cached as ``e`` expects."""
    cap = min(features.max_output_tokens or backend.max_output_tokens, backend.max_output_tokens)
    defaults, caps = decider.policy.defaults, dict(features.hosted_max_uses)
    most = max(defaults.worst_tool_calls, defaults.held_tool_calls)
    writes = e.prompt_tokens - e.cached_tokens if backend.protocol == "anthropic" else 0
    # A Chat Completions reply shows no hosted call: none is charged.
    kinds = features.hosted_tools if backend.protocol != "openai" else ()
    usage = Usage(input_tokens=e.prompt_tokens, output_tokens=cap, cache_read_tokens=e.cached_tokens,
                  cache_write_tokens=writes, tool_calls={k: caps.get(k, most) for k in kinds})  # fmt: skip
    return cost_split(backend.price, usage).total


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations())
def test_every_hold_and_every_reply_fits_the_worst_case(situation: tuple[Decider, Features]) -> None:
    decider, features = situation
    decision = decider.decide(features, explore=False)
    for e in decision.candidates:
        assert e.hold_usd is not None and e.worst_usd is not None
        slack = 1e-9 + 1e-9 * e.worst_usd  # cost_split rounds each part to 1e-10 USD
        assert e.cost_usd <= e.worst_usd + slack, e
        assert e.hold_usd <= e.worst_usd + slack, e
        assert at_the_cap(decider.catalog[e.model], e, features, decider) <= e.worst_usd + slack, e
        # Its prompt's cache may have missed: nothing read from it, all of it written (Anthropic).
        cold = Estimate(e.model, e.prompt_tokens, e.output_tokens, 0, e.cost_usd)
        assert at_the_cap(decider.catalog[e.model], cold, features, decider) <= e.worst_usd + slack, e
    assert hold_of(decision) <= worst_of(decision)
