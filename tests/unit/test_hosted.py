"""Hosted tools (web search and the like): what a reply shows of their calls, counted per kind,
and what the catalog charges for them (``router.protocols.hosted``)."""

from __future__ import annotations

import orjson
import pytest

from router.errors import ConfigError
from router.forward.accounting import cost_split
from router.policy.catalog import HOSTED_TOOL_FEES, build_catalog
from router.policy.pricing import estimate
from router.protocols import anthropic, responses
from router.protocols.common import Usage
from router.protocols.hosted import declared, max_uses
from tests.unit.test_config import BASE, parse
from tests.unit.test_decide import feats


def test_the_declared_hosted_tools_are_named_by_kind() -> None:
    tools = [{"type": "function", "name": "f"}, {"type": "web_search_preview_2025_03_11"}, {"type": "file_search"},
             {"type": "web_search_20250305", "name": "web_search"}, {"name": "bash", "input_schema": {}},
             {"type": "bash_20250124", "name": "bash"}, {"type": "custom", "name": "apply"}]  # fmt: skip
    assert declared(tools) == ("web_search_preview", "file_search", "web_search")


def test_a_requests_max_uses_caps_each_kind_it_caps_everywhere() -> None:
    """Anthropic's server tools take ``max_uses``: a kind is capped when every tool of it says
    (at their sum); one left uncapped, or a cap that is not a count, caps nothing."""
    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
             {"type": "web_search_20260101", "name": "web_search_2", "max_uses": 1},
             {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 3}, {"type": "web_fetch_20260101"},
             {"type": "code_execution_20250825", "name": "code_execution", "max_uses": True},
             {"type": "function", "name": "f", "max_uses": 1}]  # fmt: skip
    assert max_uses(tools) == {"web_search": 3}
    assert max_uses([{"type": "web_search_20250305", "max_uses": 0}]) == {"web_search": 0}


def test_the_responses_max_tool_calls_caps_every_hosted_kind() -> None:
    """``max_tool_calls`` caps a Responses reply's hosted calls, all kinds together: no kind makes
    more than it, nor more than its own cap; a client tool is no hosted kind."""
    tools = [{"type": "web_search"}, {"type": "image_generation"}, {"type": "function", "name": "f"},
             {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 1}]  # fmt: skip
    assert max_uses(tools, 2) == {"web_search": 2, "image_generation": 2, "web_fetch": 1}
    assert max_uses(tools, 0) == {"web_search": 0, "image_generation": 0, "web_fetch": 0}
    assert max_uses(tools) == {"web_fetch": 1}


def test_a_responses_reply_counts_its_hosted_calls() -> None:
    output = [
        {"type": "web_search_call", "id": "ws_1"}, {"type": "web_search_call", "id": "ws_2"},
        {"type": "code_interpreter_call", "id": "ci_1", "container_id": "c1"},
        {"type": "code_interpreter_call", "id": "ci_2", "container_id": "c1"},  # the same container
        {"type": "image_generation_call", "id": "ig_1"}, {"type": "function_call", "id": "fc_1"},
    ]  # fmt: skip
    reply = {
        "output": output,
        "tools": [{"type": "web_search"}],
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    assert responses.usage_from(reply).tool_calls == {
        "web_search": 2,
        "code_interpreter": 1,
        "image_generation": 1,
    }
    # The preview tool is priced apart: its calls are its own.
    preview = {**reply, "tools": [{"type": "web_search_preview"}]}
    assert responses.usage_from(preview).tool_calls["web_search_preview"] == 2


def test_an_anthropic_reply_counts_the_most_its_blocks_or_usage_say() -> None:
    content = [{"type": "server_tool_use", "id": "s1", "name": "web_search"},
               {"type": "server_tool_use", "id": "s2", "name": "bash_code_execution"},
               {"type": "server_tool_use", "id": "s3", "name": "text_editor_code_execution"}]  # fmt: skip
    usage = {"input_tokens": 5, "output_tokens": 1, "server_tool_use": {"web_search_requests": 3}}
    assert anthropic.usage_from({"content": content, "usage": usage}).tool_calls == {
        "web_search": 3, "code_execution": 1,
    }  # fmt: skip


def event(name: str, **data: object) -> tuple[str, bytes]:
    return name, orjson.dumps({"type": name, **data})


def test_a_stream_cut_before_its_end_is_charged_the_calls_it_began() -> None:
    obs = responses.StreamObserver()
    for name, data in (
        event("response.created", response={"id": "r", "tools": [{"type": "web_search"}]}),
        event("response.output_item.added", item={"type": "web_search_call", "id": "ws_1"}),
        event("response.output_item.done", item={"type": "web_search_call", "id": "ws_1"}),
        event("response.output_item.added", item={"type": "web_search_call", "id": "ws_2"}),
    ):
        obs.observe(name, data)
    assert obs.usage.tool_calls == {"web_search": 2}
    claude = anthropic.StreamObserver()
    for name, data in (
        event("message_start", message={"id": "m", "usage": {"input_tokens": 5, "output_tokens": 1}}),
        event("content_block_start", index=0, content_block={"type": "server_tool_use", "id": "s1", "name": "web_search"}),
    ):  # fmt: skip
        claude.observe(name, data)
    assert claude.usage.tool_calls == {"web_search": 1}
    # The usage at the end says how many were made.
    claude.observe(
        *event(
            "message_delta",
            delta={},
            usage={"output_tokens": 9, "server_tool_use": {"web_search_requests": 4}},
        )
    )
    assert claude.usage.tool_calls == {"web_search": 4}


def test_the_catalog_prices_hosted_calls_by_default_and_as_a_policy_says() -> None:
    price = build_catalog(parse(BASE))["a"].price
    assert price.per_call == HOSTED_TOOL_FEES and price.per_call["web_search"] == 0.01
    split = cost_split(
        price, Usage(input_tokens=1000, output_tokens=0, tool_calls={"web_search": 3, "unknown": 9})
    )
    assert split.tools == pytest.approx(0.03) and split.total == pytest.approx(0.03 + 1000e-6)
    text = BASE.replace(
        "prices: {input: 1, output: 2}", "prices: {input: 1, output: 2, per_call: {web_search: 0.035}}"
    )
    cheap = build_catalog(parse(text))["a"].price
    assert (
        cheap.per_call["web_search"] == 0.035
        and cheap.per_call["file_search"] == HOSTED_TOOL_FEES["file_search"]
    )
    for bad in ("per_call: {web_search: -1}", "per_call: {Web-Search: 1}", "per_calls: {web_search: 1}"):
        with pytest.raises(ConfigError, match="per_call"):
            parse(BASE.replace("prices: {input: 1, output: 2}", f"prices: {{input: 1, output: 2, {bad}}}"))


def test_a_model_that_bills_every_call_is_charged_and_estimated_its_fee() -> None:
    """A search model behind Chat Completions (gpt-5-search-api) searches on every call and bills
    the search, $0.01, while its reply shows no hosted call: neither the charge, nor the estimate
    the decision ranks by, nor the hold and the worst case a budget keeps had it. The policy says
    so (``prices.per_request``); litellm's ``input_cost_per_request`` where the map prices it."""
    text = BASE.replace("prices: {input: 1, output: 2}", "prices: {input: 1, output: 2, per_request: 0.01}")
    searching = build_catalog(parse(text))["a"]
    plain = build_catalog(parse(BASE))["a"]
    assert (searching.price.per_request, plain.price.per_request) == (0.01, 0.0)
    usage = Usage(input_tokens=1000, output_tokens=10)
    split = cost_split(searching.price, usage)
    assert split.tools == pytest.approx(0.01)
    assert split.total == pytest.approx(cost_split(plain.price, usage).total + 0.01)
    features = feats(prompt=100)
    with_fee, without = (
        estimate(searching, features, 50, hold_output=200),
        estimate(plain, features, 50, hold_output=200),
    )
    for figure in ("cost_usd", "hold_usd", "worst_usd"):
        assert getattr(with_fee, figure) == pytest.approx(getattr(without, figure) + 0.01), figure
    # From litellm's map, with the rest of the model's prices, not past the policy's own.
    mapped = BASE.replace("prices: {input: 1, output: 2}", "prices: {output: 2}")
    known = {"input_cost_per_token": 1e-6, "input_cost_per_request": 0.005}
    assert build_catalog(parse(mapped), lookup=lambda m: known)["a"].price.per_request == 0.005
    assert build_catalog(parse(text), lookup=lambda m: known)["a"].price.per_request == 0.01
    for bad in ("per_request: -1", "per_request: cheap"):
        with pytest.raises(ConfigError, match="per_request"):
            parse(BASE.replace("prices: {input: 1, output: 2}", f"prices: {{input: 1, output: 2, {bad}}}"))
