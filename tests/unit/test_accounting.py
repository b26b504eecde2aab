"""Accounting: tokens and dollars of each request, by hand for small cases, then through the in-process
router for whole and streamed replies (including streams that end badly after the commit point)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from router.fakeupstream import FakeUpstream
from router.features.bpe import default_encoding
from router.forward.accounting import cost_split, fill_missing, reasons
from router.forward.timeouts import Timeouts
from router.policy.catalog import Price
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, Usage
from router.store import RequestRecord
from tests.unit.inprocess import serving
from tests.unit.requestpath import catalog, model, request

PRICE = Price(input=1e-6, output=2e-6, cache_read=1e-7, cache_write=1.25e-6)


def test_cost_split_by_hand() -> None:
    usage = Usage(input_tokens=1000, output_tokens=50, cache_read_tokens=600, cache_write_tokens=100)
    split = cost_split(PRICE, usage)
    # 300 uncached × 1e-6, 50 × 2e-6, 600 × 1e-7, 100 × 1.25e-6
    assert (split.input, split.output, split.cache_read, split.cache_write) == pytest.approx(
        (3e-4, 1e-4, 6e-5, 1.25e-4), abs=1e-15
    )
    assert split.total == pytest.approx(5.85e-4, abs=1e-15)


def test_a_model_that_can_think_reasons_unasked_unless_it_is_anthropics_or_told_not_to() -> None:
    """OpenAI's reasoning models think at medium effort when the request names none, billed and
    unseen; Anthropic's think only when asked."""
    cat = catalog(model("o", "http://x", capabilities={"thinking": True}), model("plain", "http://x"),
                  model("claude", "http://x", protocol="anthropic", capabilities={"thinking": True}))  # fmt: skip
    unasked, off, asked = request(), request(reasoning_effort="none"), request(reasoning_effort="high")
    assert [reasons(unasked, cat[m]) for m in ("o", "plain", "claude")] == [True, False, False]
    assert not reasons(off, cat["o"]) and reasons(asked, cat["plain"]) and reasons(asked, cat["claude"])


def test_cost_split_never_charges_negative_input() -> None:
    # A provider reporting more cached than total tokens must not earn the client money.
    split = cost_split(PRICE, Usage(input_tokens=10, output_tokens=0, cache_read_tokens=20))
    assert split.input == 0 and split.cache_read == pytest.approx(2e-6)


def test_missing_usage_is_estimated_and_flagged() -> None:
    usage = Usage()
    assert fill_missing(usage, prompt_tokens_est=120, output_est=7)
    assert (usage.input_tokens, usage.output_tokens) == (120, 7)
    reported = Usage(input_tokens=5, output_tokens=3)
    assert not fill_missing(reported, prompt_tokens_est=120, output_est=7)
    assert (reported.input_tokens, reported.output_tokens) == (5, 3)
    half = Usage(input_tokens=5)
    assert fill_missing(half, prompt_tokens_est=120, output_est=7)
    assert (half.input_tokens, half.output_tokens) == (5, 7)


def hand_cost(row: RequestRecord) -> float:
    """$1/M input, $2/M output (the test catalog's prices), no cache."""
    return row.input_tokens * 1e-6 + row.output_tokens * 2e-6


def sse_data(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(orjson.loads(line[6:]))
    return out


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
@pytest.mark.parametrize("stream", [False, True])
async def test_cost_is_the_providers_usage_at_the_catalogs_prices(
    fake: FakeUpstream, tmp_path: Path, protocol: str, stream: bool
) -> None:
    family = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", OPENAI_RESPONSES: "openai_responses"}[protocol]
    async with serving(
        tmp_path, [model("a", fake.url, "text=one two three four five", protocol=family)]
    ) as r:
        answer = await r.post(protocol, stream=stream)
        (row,) = await r.records()
    assert answer.status_code == 200
    assert row.output_tokens == 5  # the fake counts a word as a token
    assert row.input_tokens > 0 and not row.usage_estimated
    assert row.cost_usd == pytest.approx(hand_cost(row), abs=1e-12)
    assert row.cost_input_usd + row.cost_output_usd == pytest.approx(row.cost_usd, abs=1e-12)


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_a_whole_reply_without_usage_is_charged_for_what_it_says(
    fake: FakeUpstream, tmp_path: Path, protocol: str
) -> None:
    # An OpenAI-compatible server that omits usage (relayed to chat clients, translated for the
    # others). Without usage, a relayed reply was charged 0 output tokens, and one translated by
    # litellm (which writes zeros for a missing usage) cost nothing at all: a backend that omits
    # usage served a budget for free. The same 2 KB reply with its usage says what it should cost.
    family = "openai"
    models = [model("bare", fake.url, "no_usage=1,big_kb=2", protocol=family),
              model("counted", fake.url, "big_kb=2", protocol=family)]  # fmt: skip
    async with serving(
        tmp_path, models, policy={"routes": [{"match": m["id"], "passthrough": m["id"]} for m in models]}
    ) as r:
        bare = await r.post(protocol, model="bare")
        counted = await r.post(protocol, model="counted")
        rows = {row.chosen_model: row for row in await r.records()}
    assert bare.status_code == counted.status_code == 200
    row, reported = rows["bare"], rows["counted"]
    assert row.usage_estimated and not reported.usage_estimated
    assert 0.5 * reported.output_tokens <= row.output_tokens <= 2 * reported.output_tokens, (
        row.output_tokens, reported.output_tokens,
    )  # fmt: skip
    assert row.input_tokens > 0
    assert row.cost_usd == pytest.approx(hand_cost(row), abs=1e-12)


async def test_chat_usage_chunk_only_for_clients_that_asked(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)]) as r:
        plain = await r.post(stream=True)
        asked = await r.post(stream=True, stream_options={"include_usage": True})
        rows = await r.records()
    assert not any(d.get("usage") for d in sse_data(plain.text))
    assert any(d.get("usage") for d in sse_data(asked.text))
    assert all(row.output_tokens and not row.usage_estimated for row in rows)  # counted either way


async def test_stream_cut_after_the_commit_point(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url, "break_after=3,chunks=6")]) as r:
        answer = await r.post(stream=True)
        (row,) = await r.records()
    assert answer.status_code == 200  # the status was sent with the first event
    events = sse_data(answer.text)
    assert events[-1]["error"]["message"] == "backend 'a' broke off the stream: ClientPayloadError"
    assert row.error_type == "UpstreamError"
    # No usage arrived: the output is the text the 3 content events relayed, tokenized.
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert row.usage_estimated and row.output_tokens == len(default_encoding().encode_ordinary(text)) > 3
    assert row.cost_usd == pytest.approx(hand_cost(row), abs=1e-12)


async def test_stream_without_its_final_event_ends_in_an_error_event(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with serving(tmp_path, [model("c", fake.url, "truncate=1", protocol="anthropic")]) as r:
        answer = await r.post(ANTHROPIC, stream=True)
        (row,) = await r.records()
    assert answer.text.rstrip().split("\n\n")[-1].startswith("event: error")
    assert "ended the stream before its final event" in answer.text
    assert row.error_type == "UpstreamError"


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_provider_error_event_after_the_first_token(
    fake: FakeUpstream, tmp_path: Path, protocol: str
) -> None:
    # The backend's error event was relayed and then followed by one of the router's own ("ended
    # the stream before its final event"): two errors for one failure.
    family = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", OPENAI_RESPONSES: "openai_responses"}[protocol]
    backends = [model("a", fake.url, "error_after=2", protocol=family), model("b", fake.url, protocol=family)]
    async with serving(tmp_path, backends) as r:
        answer = await r.post(protocol, stream=True)
        (row,) = await r.records()
    said = {
        OPENAI_CHAT: "injected stream error",
        ANTHROPIC: "Overloaded",
        OPENAI_RESPONSES: "injected stream error",
    }
    assert said[protocol] in answer.text  # relayed as the provider sent it
    errors = [
        e for e in answer.text.split("\n\n")
        if e.startswith(('data: {"error"', "event: error", "event: response.failed"))
    ]  # fmt: skip
    assert len(errors) == 1, errors
    assert row.chosen_model == "a" and row.error_type == "UpstreamError"
    assert (
        row.error_message
        == f"backend 'a' sent an error: {said[protocol].replace('injected', 'fake upstream: injected')}"
    )


async def test_fallback_is_accounted_at_the_serving_backends_price(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    pricey = {**model("b", fake.url), "prices": {"input": 10.0, "output": 20.0}}
    async with serving(tmp_path, [model("a", fake.url, "status=503"), pricey]) as r:
        await r.post()
        (row,) = await r.records()
    assert row.chosen_model == "b"
    assert [t.model for t in row.tries or []] == ["a", "b"]
    assert row.cost_usd == pytest.approx(10 * hand_cost(row), abs=1e-12)


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_bad_input_is_logged_and_answered_in_the_protocols_shape(
    fake: FakeUpstream, tmp_path: Path, protocol: str
) -> None:
    async with serving(tmp_path, [model("a", fake.url)]) as r:
        answer = await r.client.post(
            {
                OPENAI_CHAT: "/v1/chat/completions",
                ANTHROPIC: "/v1/messages",
                OPENAI_RESPONSES: "/v1/responses",
            }[protocol],
            content=b"{not json",
        )
        (row,) = await r.records()
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert row.status == 400 and row.cost_usd is None


@pytest.mark.parametrize("budget", [2**64 - 1, 2**63, -5, "2048", 1.5])
async def test_a_thinking_budget_is_a_number_of_tokens_or_a_400(
    fake: FakeUpstream, tmp_path: Path, budget: Any
) -> None:
    # 2**64 - 1 was forwarded and served, and the log store refused the request's row (an integer
    # column holds 64 bits): its spend was in no ledger, and not in a key's spend read back from the
    # log after a restart.
    async with serving(tmp_path, [model("a", fake.url, protocol="anthropic")]) as r:
        thinking = {"type": "enabled", "budget_tokens": budget}
        answer = await r.post(ANTHROPIC, max_tokens=4096, thinking=thinking)
        (row,) = await r.records()
    assert answer.status_code == 400, answer.text
    assert "thinking.budget_tokens" in answer.json()["error"]["message"]
    assert row.status == 400 and row.cost_usd is None


async def test_what_the_provider_cached_of_a_call_keys_the_next_calls_cache_cell(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    from router.policy.estimates import cache_cell

    task = {"x-router-task-id": "cache-cell-task"}
    opening = [{"role": "user", "content": "fix the parser " * 300}]
    async with serving(tmp_path, [model("a", fake.url, "cached=300")]) as r:
        assert (await r.post(headers=task, messages=opening)).status_code == 200
        turn = [*opening, {"role": "assistant", "content": "looking"}, {"role": "user", "content": "ok"}]
        assert (await r.post(headers=task, messages=turn)).status_code == 200
        first, second = await r.records()
    assert first.cache_read_tokens == 300
    (est,) = second.candidates or []
    # The first call left its reported prompt warm, 300 of it cached: how far that is behind the
    # warm prefix's whole (128-token) blocks keys the second call's cached share.
    assert est.cacheable_tokens == first.input_tokens // 128 * 128  # type: ignore[operator]
    assert est.cacheable_tokens is not None and est.cache_cell is not None
    assert est.cache_cell == cache_cell("openai", est.cacheable_tokens, 300)


#: A system prompt of about 1,300 tokens, cached for an hour.
ONE_HOUR = {
    "type": "text",
    "text": "You are a careful agent. " * 200,
    "cache_control": {"type": "ephemeral", "ttl": "1h"},
}


@pytest.mark.parametrize(
    ("protocol", "stream"), [(ANTHROPIC, False), (ANTHROPIC, True), (OPENAI_CHAT, False), (OPENAI_CHAT, True)]
)
async def test_a_prompt_cached_for_an_hour_is_charged_its_price(
    tmp_path: Path, fake: FakeUpstream, protocol: str, stream: bool
) -> None:
    """Anthropic bills a prompt token written to the cache for an hour at twice the input price,
    against 1.25 times for five minutes; every write was charged at the five-minute price, so a key
    whose agent cached for an hour spent up to 1.6 times what its budget counted (relayed, and
    translated from Chat Completions by litellm)."""
    prices = {"input": 1.0, "output": 2.0, "cache_write": 1.25}  # 1h: twice the input, by default
    async with serving(tmp_path, [model("c", fake.url, protocol="anthropic", prices=prices)]) as r:
        if protocol == ANTHROPIC:
            resp = await r.post(ANTHROPIC, system=[ONE_HOUR], stream=stream)
        else:
            messages = [{"role": "system", "content": [ONE_HOUR]}, {"role": "user", "content": "hi"}]
            resp = await r.post(OPENAI_CHAT, messages=messages, stream=stream)
        assert resp.status_code == 200, resp.text
        [row] = await r.records()
    assert row.cache_write_tokens is not None and row.cache_write_tokens > 1000
    assert row.cost_cache_write_usd == pytest.approx(row.cache_write_tokens * 2e-6)
    fresh = row.input_tokens - row.cache_write_tokens - (row.cache_read_tokens or 0)
    assert row.cost_usd == pytest.approx(
        fresh * 1e-6 + row.output_tokens * 2e-6 + row.cache_write_tokens * 2e-6
    )


def test_a_long_prompt_is_charged_the_long_context_price() -> None:
    """OpenAI bills a gpt-5.5 call whose prompt passes 272k tokens at twice the input price (and
    1.5 times the output's, twice the cached read's), the whole call; it was charged at the base
    prices, so a key sending long prompts to the default policy's gpt-5.5 (a 1.05M-token window)
    spent about twice what its budget and the log counted. The estimate a budget holds prices the
    long prompt the same way."""
    from router.policy.catalog import build_catalog, bundled_cost_map
    from router.policy.loading import load_policy
    from router.policy.pricing import estimate
    from tests.unit.test_decide import feats

    backend = build_catalog(load_policy(Path(__file__).parents[2] / "policies/default.yaml", env={}))[
        "gpt-5.5"
    ]
    known = bundled_cost_map()["gpt-5.5"]
    base = (
        known["input_cost_per_token"],
        known["output_cost_per_token"],
        known["cache_read_input_token_cost"],
    )
    long = tuple(known[f"{k}_above_272k_tokens"] for k in ("input_cost_per_token", "output_cost_per_token",
                                                           "cache_read_input_token_cost"))  # fmt: skip
    assert long[0] == 2 * base[0]

    def billed(prompt: int, cached: int, out: int, p: tuple[float, float, float]) -> float:
        return (prompt - cached) * p[0] + out * p[1] + cached * p[2]

    at_limit = Usage(input_tokens=272_000, output_tokens=2_000, cache_read_tokens=100_000)
    assert cost_split(backend.price, at_limit).total == pytest.approx(billed(272_000, 100_000, 2_000, base))
    past = Usage(input_tokens=300_000, output_tokens=2_000, cache_read_tokens=100_000)
    assert cost_split(backend.price, past).total == pytest.approx(billed(300_000, 100_000, 2_000, long))
    est = estimate(backend, feats(prompt=300_000), 2_000)
    assert est.cost_usd == pytest.approx(billed(300_000, 0, 2_000, long))


@pytest.mark.parametrize("stream", [False, True])
async def test_the_client_is_told_what_the_log_counts_with_a_try_given_up(
    fake: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    """A try given up at a timeout is billed and counted in the log; a stream's ``usage.cost``
    left it out (a whole reply's ``x-router-cost-usd`` had it)."""
    quick = Timeouts(connect=1.0, first_token=0.2, idle=0.2, overall=10.0)
    async with serving(tmp_path, [model("slow", fake.url, "ttft_ms=1500"), model("a", fake.url)],
                       timeouts=quick) as r:  # fmt: skip
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        answer = await r.post(stream=stream, **usage)
        (row,) = await r.records()
    assert answer.status_code == 200
    assert [t.model for t in row.tries or []] == ["slow", "a"]
    gave_up = (row.tries or [])[0].cost_usd
    assert gave_up is not None and gave_up > 0
    if stream:
        told = [d["usage"]["cost"] for d in sse_data(answer.text) if d.get("usage")][-1]
    else:
        told = float(answer.headers["x-router-cost-usd"])
    assert told == pytest.approx(row.cost_usd, abs=1e-9)
