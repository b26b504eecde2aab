"""The retry loop (router.forward.execute) against the fake provider, in this process.

Each test builds a catalog whose backends misbehave in a known way and checks which backends the
fake was called for, in which order, and what the request ends with.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from router.errors import MissingCredentials, RateLimited, ServiceUnavailable, UpstreamError, UpstreamTimeout
from router.fakeupstream import FakeUpstream
from router.forward.execute import Execution, RetryBudget, Try, _pause
from router.forward.timeouts import gives_up_at_first_token
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from router.protocols.common import FAMILY
from router.shared import BreakerConfig
from router.store.records import TryRecord
from router.telemetry.phases import Phases
from tests.unit.requestpath import (
    called,
    calls,
    catalog,
    decision,
    executor,
    fresh,
    model,
    request,
    upstream,
)

#: No retry at all: the budget starts empty and earns nothing.
NO_RETRIES = RetryBudget(ratio=0.0, cap=0.0)


def statuses(tries: list[Try]) -> list[tuple[str, int | None]]:
    return [(t.model, t.status) for t in tries]


async def test_first_backend_serves(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url), model("b", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        reply = await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    assert reply.obj["choices"][0]["message"]["content"]
    assert called(fake, cat) == ["a"]
    assert statuses(ex.tries) == [("a", 200)]
    assert ex.backend is not None and ex.backend.id == "a"
    assert ex.retries == 0


async def test_retryable_failure_moves_on_without_retrying(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=503"), model("b", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    # Another backend is left, so moving on beats pausing to retry the first.
    assert called(fake, cat) == ["a", "b"]
    assert statuses(ex.tries) == [("a", 503), ("b", 200)]
    assert ex.tries[0].error_type == "UpstreamError"
    assert ex.retries == 0


async def test_rejected_request_is_returned_not_retried_or_moved_on(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=422"), model("b", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        with pytest.raises(UpstreamError) as info:
            await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    assert info.value.status == 422
    assert "injected 422" in info.value.message
    assert called(fake, cat) == ["a"]


async def test_rate_limited_backend_moves_on(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=429"), model("b", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    assert statuses(ex.tries) == [("a", 429), ("b", 200)]
    assert ex.tries[0].error_type == "RateLimited"


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC])  # relayed; translated by litellm
async def test_a_backend_that_refuses_the_routers_key_moves_on(
    fake: FakeUpstream, status: int, protocol: str
) -> None:
    """A provider's 401 or 403 refuses the router's key for it, not the client's: it was passed on
    as the client's own authentication_error (Claude Code asks to log in again) and no other
    backend was tried, so one expired provider key failed every request routed to it."""
    cat = catalog(model("a", fake.url, f"status={status}"), model("b", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(protocol), decision("a", "b"), cat, {}, phases, ex)
        assert statuses(ex.tries) == [("a", status), ("b", 200)]
        with pytest.raises(UpstreamError) as alone:
            await executor(up, cat).complete(request(protocol), decision("a"), cat, {}, *fresh())
    assert alone.value.status == 502 and alone.value.upstream_status == status
    assert alone.value.anthropic_body()["error"]["type"] == "api_error"
    assert "refused this backend's key" in alone.value.message


async def test_last_backend_is_retried_once(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=503"), model("b", fake.url, "fail_times=1,status=503"))
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    assert called(fake, cat) == ["a", "b", "b"]
    assert statuses(ex.tries) == [("a", 503), ("b", 503), ("b", 200)]
    assert ex.retries == 1


async def test_last_backend_is_retried_only_once(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=500"))
    async with upstream() as up:
        phases, ex = fresh()
        with pytest.raises(UpstreamError) as info:
            await executor(up, cat).complete(request(), decision("a"), cat, {}, phases, ex)
    assert info.value.upstream_status == 500
    assert called(fake, cat) == ["a", "a"]
    assert ex.retries == 1


async def test_exhausted_retry_budget_stops_retries(fake: FakeUpstream) -> None:
    """Issue 23's first surviving fault: the retry loop ignoring its budget."""
    cat = catalog(model("a", fake.url, "status=503"))
    async with upstream() as up:
        # One retry banked, half a retry earned per request.
        run = executor(up, cat, budget=RetryBudget(ratio=0.5, cap=1.0))
        retries = []
        for _ in range(3):
            phases, ex = fresh()
            with pytest.raises(UpstreamError):
                await run.complete(request(), decision("a"), cat, {}, phases, ex)
            retries.append(ex.retries)
    # 1st: the banked retry is spent; 2nd: only 0.5 earned, no retry; 3rd: 1.0 again, a retry.
    assert retries == [1, 0, 1]
    assert called(fake, cat) == ["a", "a", "a", "a", "a"]


async def test_empty_retry_budget_never_retries(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "fail_times=1,status=503"))
    async with upstream() as up:
        phases, ex = fresh()
        with pytest.raises(UpstreamError):
            await executor(up, cat, budget=NO_RETRIES).complete(request(), decision("a"), cat, {}, phases, ex)
    # The fake would have answered the second call: only the budget kept it from being made.
    assert called(fake, cat) == ["a"]
    assert ex.retries == 0


def test_retry_budget_earns_a_share_up_to_its_cap() -> None:
    budget = RetryBudget(ratio=0.25, cap=2.0)
    assert budget.spend() and budget.spend()  # starts full
    assert not budget.spend()
    for _ in range(3):
        budget.earn()
    assert not budget.spend()  # 0.75 < 1
    budget.earn()
    assert budget.spend()  # 1.0
    for _ in range(100):
        budget.earn()
    assert budget.spend() and budget.spend() and not budget.spend()  # capped at 2


async def test_retry_after_longer_than_the_deadline_is_not_waited_for(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=503,retry_after=30"))
    async with upstream(overall=5.0) as up:
        phases, ex = fresh()
        started = time.monotonic()
        with pytest.raises(UpstreamError) as info:
            await executor(up, cat).complete(request(), decision("a"), cat, {}, phases, ex)
    assert time.monotonic() - started < 5.0
    assert info.value.retry_after == 30
    assert called(fake, cat) == ["a"]
    assert ex.retries == 0


async def test_retry_after_is_honoured(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "fail_times=1,status=429,retry_after=0.3"))
    async with upstream() as up:
        phases, ex = fresh()
        started = time.monotonic()
        await executor(up, cat, backoff_s=0.0).complete(request(), decision("a"), cat, {}, phases, ex)
    assert time.monotonic() - started >= 0.3  # the provider's pause, not the (zero) backoff
    assert called(fake, cat) == ["a", "a"]


def test_pause_is_retry_after_else_jittered_backoff() -> None:
    assert _pause(UpstreamError("x", upstream_status=503, retry_after=7.0), 0.25) == 7.0
    pauses = [_pause(UpstreamError("x", upstream_status=503), 1.0) for _ in range(200)]
    assert all(p is not None and 0.5 <= p <= 1.5 for p in pauses)
    assert max(p for p in pauses if p is not None) - min(p for p in pauses if p is not None) > 0.5


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_context_length_error_falls_over_to_larger_windows_only(
    fake: FakeUpstream, protocol: str
) -> None:
    """A window too small for the prompt: backends no larger are skipped, a larger one serves."""
    family = FAMILY[protocol]
    cat = catalog(
        model("small", fake.url, "context_window=1", protocol=family, window=8_000),
        model("same", fake.url, protocol=family, window=8_000),
        model("smaller", fake.url, protocol=family, window=4_000),
        model("larger", fake.url, "context_window=2", protocol=family, window=16_000),
        model("largest", fake.url, protocol=family, window=32_000),
    )
    async with upstream() as up:
        phases, ex = fresh()
        order = decision("small", "same", "smaller", "larger", "largest")
        await executor(up, cat).complete(request(protocol), order, cat, {}, phases, ex)
    assert called(fake, cat) == ["small", "larger", "largest"]
    assert statuses(ex.tries) == [("small", 400), ("larger", 400), ("largest", 200)]


async def test_context_length_error_with_no_larger_window_is_the_answer(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "context_window=1", window=8_000), model("b", fake.url, window=8_000))
    async with upstream() as up:
        phases, ex = fresh()
        with pytest.raises(UpstreamError) as info:
            await executor(up, cat).complete(request(), decision("a", "b"), cat, {}, phases, ex)
    assert info.value.status == 400
    assert info.value.code == "context_length_exceeded"
    assert called(fake, cat) == ["a"]


async def test_overall_deadline_ends_the_request_and_its_fallbacks(fake: FakeUpstream) -> None:
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"), model("fast", fake.url))
    async with upstream(overall=0.3) as up:
        phases, ex = fresh()
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as info:
            await executor(up, cat).complete(request(), decision("slow", "fast"), cat, {}, phases, ex)
    assert time.monotonic() - started < 2.0
    assert info.value.which == "overall"
    assert info.value.code == "overall_timeout"
    assert called(fake, cat) == ["slow"]
    assert ex.tries[0].error_type == "UpstreamTimeout"
    assert ex.tries[0].status == 504


async def test_concurrency_slot_makes_calls_wait_their_turn(fake: FakeUpstream) -> None:
    cat = catalog(model("one", fake.url, "ttft_ms=300", max_concurrency=1))
    async with upstream() as up:
        run = executor(up, cat)
        await asyncio.gather(*(run.complete(request(), decision("one"), cat, {}, *fresh()) for _ in range(2)))
    arrivals = [r["time"] for r in calls(fake, cat["one"])]
    assert len(arrivals) == 2
    # The second call reached the provider only after the first one's 300 ms answer.
    assert arrivals[1] - arrivals[0] >= 0.25


async def test_waiting_for_a_slot_counts_against_the_deadline(fake: FakeUpstream) -> None:
    cat = catalog(model("one", fake.url, "ttft_ms=500", max_concurrency=1))
    async with upstream(overall=0.8) as up:
        run = executor(up, cat, budget=NO_RETRIES)
        results = await asyncio.gather(
            *(run.complete(request(), decision("one"), cat, {}, *fresh()) for _ in range(2)),
            return_exceptions=True,
        )
    assert sum(isinstance(r, UpstreamTimeout) for r in results) == 1
    assert sum(not isinstance(r, BaseException) for r in results) == 1


async def test_a_failed_call_gives_its_slot_back(fake: FakeUpstream) -> None:
    cat = catalog(model("one", fake.url, "status=503", max_concurrency=1))
    async with upstream(overall=2.0) as up:
        run = executor(up, cat, budget=NO_RETRIES)
        for _ in range(3):
            with pytest.raises(UpstreamError) as info:
                await run.complete(request(), decision("one"), cat, {}, *fresh())
            assert info.value.upstream_status == 503  # not a timeout waiting for a lost slot
    assert called(fake, cat) == ["one"] * 3


async def test_stream_holds_its_slot_until_released(fake: FakeUpstream) -> None:
    cat = catalog(model("one", fake.url, max_concurrency=1))
    async with upstream(overall=0.5) as up:
        run = executor(up, cat, budget=NO_RETRIES)
        first = await run.open_stream(request(stream=True), decision("one"), cat, {}, *fresh())
        with pytest.raises(UpstreamTimeout):
            await run.open_stream(request(stream=True), decision("one"), cat, {}, *fresh())
        async for _ in first.rest:
            pass
        first.release()
        second = await run.open_stream(request(stream=True), decision("one"), cat, {}, *fresh())
        await second.rest.aclose()  # type: ignore[attr-defined]
        second.release()
    assert called(fake, cat) == ["one", "one"]


async def test_use_sizes_the_slots_for_a_reloaded_catalog(fake: FakeUpstream) -> None:
    unlimited = catalog(model("one", fake.url, "ttft_ms=300"))
    async with upstream() as up:
        run = executor(up, catalog(model("one", fake.url, "ttft_ms=300", max_concurrency=1)))
        run.use(unlimited)
        await asyncio.gather(
            *(run.complete(request(), decision("one"), unlimited, {}, *fresh()) for _ in range(2))
        )
    arrivals = [r["time"] for r in calls(fake, unlimited["one"])]
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] < 0.25


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_error_event_before_the_first_token_moves_on(fake: FakeUpstream, protocol: str) -> None:
    family = FAMILY[protocol]
    cat = catalog(
        model("broken", fake.url, "error_after=0", protocol=family), model("fine", fake.url, protocol=family)
    )
    async with upstream() as up:
        phases, ex = fresh()
        committed = await executor(up, cat).open_stream(
            request(protocol, stream=True), decision("broken", "fine"), cat, {}, phases, ex
        )
        async for _ in committed.rest:
            pass
        committed.release()
    assert committed.backend.id == "fine"
    assert committed.held  # the events up to the first content, held back until the commit
    assert called(fake, cat) == ["broken", "fine"]
    assert [t.error_type for t in ex.tries] == ["UpstreamError", None]
    assert phases.first_token is not None


async def test_error_event_after_the_first_token_is_past_the_commit_point(fake: FakeUpstream) -> None:
    cat = catalog(model("late", fake.url, "error_after=2"), model("fine", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        committed = await executor(up, cat).open_stream(
            request(stream=True), decision("late", "fine"), cat, {}, phases, ex
        )
        rest = [ev async for ev in committed.rest]
        committed.release()
    assert committed.backend.id == "late"
    assert rest[-1].data.startswith(b'{"error"')  # passed on to the client: too late to move
    assert called(fake, cat) == ["late"]


async def test_first_token_timeout_moves_on_and_names_itself(fake: FakeUpstream) -> None:
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"), model("fine", fake.url))
    async with upstream(first_token=0.2, overall=10.0) as up:
        phases, ex = fresh()
        committed = await executor(up, cat).open_stream(
            request(stream=True), decision("slow", "fine"), cat, {}, phases, ex
        )
        await committed.rest.aclose()  # type: ignore[attr-defined]
    assert committed.backend.id == "fine"
    assert [(t.model, t.error_type) for t in ex.tries] == [("slow", "UpstreamTimeout"), ("fine", None)]


async def test_a_try_billed_without_serving_is_held_for_before_the_next(fake: FakeUpstream) -> None:
    """The provider bills a try given up at a timeout; before the next try spends again, the
    budgets are asked to hold it (``Execution.hold_billed``), and a refusal stops the request
    there. Tries that failed unbilled (a 503) ask nothing."""
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"), model("down", fake.url, "status=503"),
                  model("fine", fake.url))  # fmt: skip
    seen: list[list[tuple[str, bool]]] = []

    async def hold(tries: list[Try]) -> None:
        seen.append([(t.model, t.billed) for t in tries])

    async with upstream(first_token=0.2, overall=10.0) as up:
        phases, ex = fresh()
        ex.hold_billed = hold
        committed = await executor(up, cat).open_stream(
            request(stream=True), decision("down", "slow", "fine"), cat, {}, phases, ex
        )
        await committed.rest.aclose()  # type: ignore[attr-defined]
        assert seen == [[("down", False), ("slow", True)]]

        async def refuse(tries: list[Try]) -> None:
            raise RateLimited("budget held")

        phases, ex = fresh()
        ex.hold_billed = refuse
        with pytest.raises(RateLimited):
            await executor(up, cat).open_stream(
                request(stream=True), decision("slow", "fine"), cat, {}, phases, ex
            )
    assert [t.model for t in ex.tries] == ["slow"]


async def test_a_failure_that_reports_its_usage_charges_its_try_that(fake: FakeUpstream) -> None:
    """A Responses stream that fails before its first token with ``response.failed`` carries the
    usage its provider bills (520 output tokens here): the failed try takes it, from the error
    (``UpstreamError.usage``), and the next backend serves; a try failing without one has none."""
    cat = catalog(model("failing", fake.url, "error_after=0,failed_event=1", protocol="openai_responses"),
                  model("down", fake.url, "status=503", protocol="openai_responses"),
                  model("fine", fake.url, protocol="openai_responses"))  # fmt: skip
    req = request(OPENAI_RESPONSES, stream=True, reasoning={"effort": "high"})
    async with upstream() as up:
        phases, ex = fresh()
        committed = await executor(up, cat).open_stream(
            req, decision("failing", "down", "fine"), cat, {}, phases, ex
        )
        await committed.rest.aclose()  # type: ignore[attr-defined]
    assert [t.model for t in ex.tries] == ["failing", "down", "fine"]
    failed, down, _ = ex.tries
    assert failed.usage is not None and failed.usage.output_tokens == 520
    assert down.usage is None


async def test_first_token_timeout_is_reported_as_such(fake: FakeUpstream) -> None:
    """A try given up for another backend that then cannot be called (its breaker paused it)
    ends the request with the first-token timeout, named."""
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"), model("paused", fake.url, "status=503"))
    async with upstream(first_token=0.2, overall=10.0) as up:
        run = executor(up, cat, budget=NO_RETRIES, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))
        with pytest.raises(UpstreamError):
            await run.complete(request(), decision("paused"), cat, {}, *fresh())
        with pytest.raises(UpstreamTimeout) as info:
            await run.open_stream(request(stream=True), decision("slow", "paused"), cat, {}, *fresh())
    assert info.value.which == "first_token"


def test_a_try_is_given_up_at_the_first_token_timeout_only_for_another_backend() -> None:
    assert gives_up_at_first_token("a", ["b"])
    assert gives_up_at_first_token("a", ["a", "b"])
    assert not gives_up_at_first_token("a", [])  # the last candidate, or its retry
    assert not gives_up_at_first_token("a", ["a"])


async def test_the_last_backend_is_waited_for_past_the_first_token_timeout(fake: FakeUpstream) -> None:
    """Given up at the first-token timeout, the one backend a request had was tried again from
    the start: two tries billed and a 504 where waiting for the first served it. A stream's last
    backend standing is now waited for to the overall deadline; one before it is still given up
    for the next."""
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"), model("slower", fake.url, "ttft_ms=1500"))
    async with upstream(first_token=0.2, overall=10.0) as up:
        run = executor(up, cat)
        phases, ex = fresh()
        committed = await run.open_stream(request(stream=True), decision("slow"), cat, {}, phases, ex)
        await committed.rest.aclose()  # type: ignore[attr-defined]
        assert statuses(ex.tries) == [("slow", 200)] and ex.retries == 0 and ex.patient
        phases, ex = fresh()
        committed = await run.open_stream(
            request(stream=True), decision("slow", "slower"), cat, {}, phases, ex
        )
        await committed.rest.aclose()  # type: ignore[attr-defined]
    assert [(t.model, t.error_type, t.billed) for t in ex.tries] == [
        ("slow", "UpstreamTimeout", True),
        ("slower", None, False),
    ]


async def test_the_last_backend_is_still_retried_after_a_failure_and_its_retry_waited_for(
    fake: FakeUpstream,
) -> None:
    """A real failure (a 503) of the one backend is retried as before; the retry, with nothing
    after it, is not given up at the first-token timeout."""
    cat = catalog(model("a", fake.url, "fail_times=1,status=503,ttft_ms=600"))
    async with upstream(first_token=0.2, overall=10.0) as up:
        phases, ex = fresh()
        committed = await executor(up, cat).open_stream(
            request(stream=True), decision("a"), cat, {}, phases, ex
        )
        await committed.rest.aclose()  # type: ignore[attr-defined]
    assert statuses(ex.tries) == [("a", 503), ("a", 200)] and ex.retries == 1


async def test_stream_overall_deadline_before_first_token(fake: FakeUpstream) -> None:
    """When the overall deadline comes before the first-token one, the error names the deadline."""
    cat = catalog(model("slow", fake.url, "ttft_ms=1500"))
    async with upstream(first_token=5.0, overall=0.3) as up:
        with pytest.raises(UpstreamTimeout) as info:
            await executor(up, cat).open_stream(request(stream=True), decision("slow"), cat, {}, *fresh())
    assert info.value.which == "overall"


async def test_open_breaker_skips_its_backend(fake: FakeUpstream) -> None:
    cat = catalog(model("bad", fake.url, "status=503"), model("good", fake.url))
    async with upstream() as up:
        run = executor(up, cat, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))
        await run.complete(request(), decision("bad", "good"), cat, {}, *fresh())
        phases, ex = fresh()
        await run.complete(request(), decision("bad", "good"), cat, {}, phases, ex)
    assert [(t.model, t.error_type) for t in ex.tries] == [("bad", "BreakerOpen"), ("good", None)]
    assert called(fake, cat) == ["bad", "good", "good"]


async def test_every_breaker_open_is_service_unavailable(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "status=503"), model("b", fake.url, "status=503"))
    async with upstream() as up:
        run = executor(up, cat, budget=NO_RETRIES, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))
        with pytest.raises(UpstreamError):
            await run.complete(request(), decision("a", "b"), cat, {}, *fresh())
        with pytest.raises(ServiceUnavailable, match="a, b"):
            await run.complete(request(), decision("a", "b"), cat, {}, *fresh())
    assert called(fake, cat) == ["a", "b"]


async def test_missing_key_moves_on(fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTER_TEST_UNSET_KEY", raising=False)
    cat = catalog(model("keyless", fake.url, api_key_env="ROUTER_TEST_UNSET_KEY"), model("open", fake.url))
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("keyless", "open"), cat, {}, phases, ex)
    assert [(t.model, t.error_type) for t in ex.tries] == [("keyless", "MissingCredentials"), ("open", None)]
    assert called(fake, cat) == ["open"]
    assert MissingCredentials.next_candidate


async def test_every_key_missing_names_every_variable(
    fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A router started without any provider key said only the last backend's variable, so its
    operator set that one and met the next: the error names every backend and variable tried."""
    for var in ("ROUTER_TEST_UNSET_A", "ROUTER_TEST_UNSET_B"):
        monkeypatch.delenv(var, raising=False)
    cat = catalog(
        model("first", fake.url, api_key_env="ROUTER_TEST_UNSET_A"),
        model("second", fake.url, api_key_env="ROUTER_TEST_UNSET_B"),
        model("third", fake.url, api_key_env="ROUTER_TEST_UNSET_B"),
    )
    async with upstream() as up:
        with pytest.raises(MissingCredentials) as info:
            await executor(up, cat).complete(
                request(), decision("first", "second", "third"), cat, {}, *fresh()
            )
    assert str(info.value) == (
        "no backend could be called, their key variables are not set: "
        "ROUTER_TEST_UNSET_A (first), ROUTER_TEST_UNSET_B (second, third)"
    )
    assert called(fake, cat) == []


async def test_each_failing_backend_is_tried_once_in_order(fake: FakeUpstream) -> None:
    cat = catalog(
        model("a", fake.url, "status=500"), model("b", fake.url, "status=502"), model("c", fake.url)
    )
    async with upstream() as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("a", "b", "c"), cat, {}, phases, ex)
    assert called(fake, cat) == ["a", "b", "c"]
    assert statuses(ex.tries) == [("a", 500), ("b", 502), ("c", 200)]


async def test_a_retry_fits_in_less_than_a_second(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "fail_times=1,status=503"))
    async with upstream(overall=0.8) as up:
        phases, ex = fresh()
        await executor(up, cat).complete(request(), decision("a"), cat, {}, phases, ex)
    assert called(fake, cat) == ["a", "a"] and ex.retries == 1


def test_default_retry_budget_is_a_fifth_of_traffic_capped_at_twenty() -> None:
    budget = RetryBudget()
    assert sum(budget.spend() for _ in range(30)) == 20
    for _ in range(4):
        budget.earn()
    assert not budget.spend()
    budget.earn()
    assert budget.spend()


async def test_tries_say_when_each_call_started_and_how_long_it_took(fake: FakeUpstream) -> None:
    cat = catalog(model("bad", fake.url, "status=503"), model("slow", fake.url, "ttft_ms=200"))
    async with upstream() as up:
        run = executor(up, cat, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))
        await run.complete(request(), decision("bad", "slow"), cat, {}, *fresh())
        phases, ex = fresh()
        await run.complete(request(), decision("bad", "slow"), cat, {}, phases, ex)
    skipped, served = (t.record(phases.arrival) for t in ex.tries)
    assert skipped == TryRecord("bad", start_ms=None, ms=None, status=None, error_type="BreakerOpen")
    assert served.model == "slow" and served.status == 200 and served.error_type is None
    assert (
        served.start_ms is not None and 0 <= served.start_ms < 150
    )  # began as soon as the breaker said skip
    assert served.ms is not None and 200 <= served.ms < 2000  # the provider's 200 ms before answering, in ms
    started, ended = ex.tries[1].start, ex.tries[1].end
    assert started is not None and served.start_ms == round((started - phases.arrival) * 1000, 3)
    assert served.ms == round((ended - started) * 1000, 3)  # milliseconds to the microsecond


async def test_stream_error_before_the_first_token_names_the_backend(fake: FakeUpstream) -> None:
    cat = catalog(model("broken", fake.url, "error_after=0"))
    async with upstream() as up:
        with pytest.raises(UpstreamError, match="backend 'broken' failed before its first token"):
            await executor(up, cat, budget=NO_RETRIES).open_stream(
                request(stream=True), decision("broken"), cat, {}, *fresh()
            )


async def test_committed_stream_holds_the_events_up_to_the_first_token(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "chunks=3,text=alpha beta gamma"))
    async with upstream() as up:
        committed = await executor(up, cat).open_stream(
            request(stream=True), decision("a"), cat, {}, *fresh()
        )
        assert b"alpha" in committed.held[-1].raw  # the first content event closes the held part
        assert not any(b"beta" in ev.raw for ev in committed.held)
        assert not committed.observer.done
        async for ev in committed.rest:
            committed.observer.observe(ev.name, ev.data)
        committed.release()
    # The observer that saw the held events sees the rest: the usage chunk at the end is counted.
    assert committed.observer.done and committed.observer.usage.output_tokens == 3


async def test_a_translated_backends_failure_names_the_backend(fake: FakeUpstream, tmp_path: Path) -> None:
    # Through litellm it was "anthropic backend answered 500": with several backends of a wire
    # format, which one failed was left to guess (the relay path says "backend 'c' answered 500").
    from tests.unit.inprocess import serving

    async with serving(tmp_path, [model("c", fake.url, "status=500", protocol="anthropic")]) as r:
        failed = await r.post(OPENAI_CHAT)
    assert failed.status_code == 502
    assert failed.json()["error"]["message"].startswith("backend 'c' (anthropic) answered 500: "), failed.text


async def test_a_request_litellm_cannot_convert_opens_no_breaker(fake: FakeUpstream, tmp_path: Path) -> None:
    # litellm raises its APIConnectionError around its own conversion error: read as the backend
    # breaking off, each such request was retried and three opened the breaker for every client.
    # It was then a 502 'translation for backend 'c' (anthropic) failed (Exception)', the router's
    # failure, for a request the client has to change: now the client's 400 naming the part.
    from tests.unit.inprocess import serving

    # A known part type litellm cannot put in a user turn (an unknown one is refused at ingress).
    bogus = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    async with serving(tmp_path, [model("c", fake.url, protocol="anthropic")]) as r:
        for stream in [False, True] * 3:
            refused = await r.post(OPENAI_CHAT, messages=bogus, stream=stream)
            assert refused.status_code == 400, refused.text
            err = refused.json()["error"]
            assert (err["type"], err["param"]) == ("invalid_request_error", "messages")
            assert err["message"] == (
                "invalid request: messages.1.content.0: a part of type 'refusal' in a user message cannot be "
                "translated for backend 'c' (anthropic)"
            )
        assert (await r.post(OPENAI_CHAT)).status_code == 200
        assert [len(row.tries) for row in (await r.records())[:6]] == [1] * 6  # not retried


@pytest.mark.parametrize(
    ("protocol", "body"),
    [
        (
            OPENAI_CHAT,
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        ),
        (
            OPENAI_RESPONSES,
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        ),
    ],
)
async def test_a_conversion_failure_no_module_names_is_the_clients_400_too(
    fake: FakeUpstream, tmp_path: Path, protocol: str, body: dict[str, Any]
) -> None:
    # An image URL litellm cannot read for Anthropic (neither data: nor http): the field is not
    # named (litellm's own message quotes the request), but the failure is the request's, a 400
    # not retried; it was a 502, the router's.
    from tests.unit.inprocess import serving

    vision = model("c", fake.url, protocol="anthropic", capabilities={"vision": True})
    async with serving(tmp_path, [vision]) as r:
        for _ in range(6):
            refused = await r.post(protocol, **body)
            assert refused.status_code == 400, refused.text
            err = refused.json()["error"]
            assert err["type"] == "invalid_request_error"
            assert err["message"].startswith(
                "invalid request: the request cannot be translated for backend 'c' (anthropic): litellm could "
                "not convert it ("
            ), err
        assert (await r.post(protocol)).status_code == 200
        assert [len(row.tries) for row in (await r.records())[:6]] == [1] * 6  # not retried


#: A conversation whose tool call's arguments are not JSON: litellm cannot translate it for an
#: Anthropic backend (the call's input is read from them); OpenAI takes it as it is.
_BROKEN_CALL = [
    {"role": "user", "content": "run it"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{not json"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]  # fmt: skip


async def test_a_request_no_candidate_can_translate_is_the_clients_400(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # litellm raised a BadRequestError around the arguments' JSONDecodeError, read as "a reply that
    # is not JSON": a 502 after both backends were tried, each try retryable, and five such
    # requests opened a backend's breaker for every client.
    from tests.unit.inprocess import serving

    models = [model("c", fake.url, protocol="anthropic"), model("d", fake.url, protocol="anthropic")]
    async with serving(tmp_path, models) as r:
        for _ in range(6):
            refused = await r.post(OPENAI_CHAT, messages=_BROKEN_CALL)
            assert refused.status_code == 400, refused.text
            err = refused.json()["error"]
            assert (err["type"], err["param"]) == ("invalid_request_error", "messages")
            assert err["message"].startswith("invalid request: messages.1.tool_calls.0.function.arguments: ")
        assert (await r.post(OPENAI_CHAT)).status_code == 200
        rows = (await r.records())[:6]
    assert all(sorted((t.model, t.status) for t in row.tries) == [("c", 400), ("d", 400)] for row in rows)


async def test_a_candidates_own_failure_is_said_before_a_request_another_cannot_translate(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # The relayed backend failed by itself, the dearer one cannot translate the request: the client
    # is told what may pass (the 503), not that its request is at fault, nor, as before, that
    # "translation for backend 'c' (anthropic) failed".
    from tests.unit.inprocess import serving

    dear = model("c", fake.url, protocol="anthropic", prices={"input": 5.0, "output": 10.0})
    async with serving(tmp_path, [model("a", fake.url, "status=503"), dear]) as r:
        failed = await r.post(OPENAI_CHAT, messages=_BROKEN_CALL)
        tries = (await r.records())[-1].tries
    assert [(t.model, t.status) for t in tries] == [("a", 503), ("c", 400)]
    assert failed.status_code == 502
    assert failed.json()["error"]["message"].startswith("backend 'a' answered 503"), failed.text


async def test_a_paused_candidate_is_said_before_a_request_another_cannot_translate(
    fake: FakeUpstream,
) -> None:
    # The relayed backend is paused by its breaker, the other cannot translate the request: not
    # the client's 400 (the paused one may serve it once it recovers), a 503 that says both.
    cat = catalog(model("a", fake.url, "status=503"), model("c", fake.url, protocol="anthropic"))
    async with upstream() as up:
        run = executor(up, cat, budget=NO_RETRIES, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))
        with pytest.raises(UpstreamError):
            await run.complete(request(), decision("a"), cat, {}, *fresh())
        with pytest.raises(ServiceUnavailable) as info:
            await run.complete(request(messages=_BROKEN_CALL), decision("a", "c"), cat, {}, *fresh())
    assert info.value.message.startswith("candidate backends are failing and paused by their breakers: a; ")
    assert "messages.1.tool_calls.0.function.arguments" in info.value.message


@pytest.mark.parametrize("stream", [False, True])
async def test_waiting_for_a_slot_in_the_router_opens_no_breaker(
    fake: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    # A request whose overall deadline passed while it queued for the backend's concurrency slot
    # was given up as an 'overall' timeout and counted against the backend's breaker, as a request
    # that may have caused its own failure: two keys' queues opened the breaker of a backend that
    # answered every call it got in 300 ms.
    from router.forward.timeouts import Timeouts
    from router.shared import BreakerState
    from tests.unit.inprocess import MASTER, serving

    one = model("one", fake.url, "ttft_ms=300", max_concurrency=1)
    async with serving(tmp_path, [one], master_key=MASTER, timeouts=Timeouts(overall=1.5)) as r:
        keys = [(await r.key("a"))[0], (await r.key("b"))[0]]
        answers = await asyncio.gather(*(r.post(key=k, stream=stream) for k in keys * 8))
        statuses = sorted(a.status_code for a in answers)
        assert 200 in statuses and set(statuses) == {200, 504}, statuses
        assert statuses.count(504) >= 5  # the breaker's threshold, had the waits counted
        assert await r.s.state.breakers.state("one") == BreakerState.CLOSED
        assert (await r.post(key=keys[0], stream=stream)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_a_deadline_spent_queueing_in_the_router_is_not_the_backends(
    fake: FakeUpstream, stream: bool
) -> None:
    # Three calls behind max_concurrency 1, a backend answering in 1 s, a deadline of 1.6 s: the
    # first is served; the second waits 1 s for the slot and its deadline passes at the backend
    # 0.6 s later; the third's passes while it waits. Neither is the backend's doing: each opened
    # the breaker (one failure its threshold here), the second's at its tenant's first suspect.
    from router.shared import BreakerState

    cat = catalog(model("one", fake.url, "ttft_ms=1000", max_concurrency=1))
    async with upstream(overall=1.6) as up:
        run = executor(up, cat, budget=NO_RETRIES, breaker=BreakerConfig(failure_threshold=1, cooldown_s=60))

        async def go(phases: Phases, ex: Execution) -> None:
            if not stream:
                await run.complete(request(), decision("one"), cat, {}, phases, ex)
                return
            committed = await run.open_stream(request(stream=True), decision("one"), cat, {}, phases, ex)
            async for _ in committed.rest:
                pass
            committed.release()

        exs = [fresh() for _ in range(3)]
        for tenant, (_, ex) in zip("abc", exs, strict=True):
            ex.tenant = tenant
        results = await asyncio.gather(*(go(*pe) for pe in exs), return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["NoneType", "UpstreamTimeout", "UpstreamTimeout"]
        assert [(ex.tries[0].start is None) for _, ex in exs[1:]] == [False, True]  # reached it; never did
        assert await run.breakers.state("one") == BreakerState.CLOSED


async def test_a_turn_says_whether_the_try_waited_in_the_router(fake: FakeUpstream) -> None:
    # The retry loop reads it for the breaker (_queue_spent); it was a field the wait set on the
    # request's Execution for the loop to read back later.
    cat = catalog(model("one", fake.url, max_concurrency=1), model("other", fake.url, protocol="anthropic"))
    async with upstream() as up:
        run = executor(up, cat)
        first = await run._wait_turn(cat["one"], OPENAI_CHAT)
        assert first.queued is False and first.slot is not None
        second = asyncio.create_task(run._wait_turn(cat["one"], OPENAI_CHAT))
        await asyncio.sleep(0.05)
        assert not second.done()  # behind the first for the backend's one slot
        first.release()
        assert (await second).queued is True
        second.result().release()
        # A translated call before litellm has loaded waits for the load; after it, it does not.
        assert (await run._wait_turn(cat["other"], OPENAI_CHAT)) == (None, True)
        assert (await run._wait_turn(cat["other"], OPENAI_CHAT)) == (None, False)


@pytest.mark.parametrize("protocol", [ANTHROPIC, OPENAI_CHAT])  # relayed; translated by litellm
async def test_a_prompt_and_max_tokens_over_the_window_move_to_a_larger_window(
    fake: FakeUpstream, tmp_path: Path, protocol: str
) -> None:
    # The decision's estimate of the prompt (~4,800 tokens) and the client's 12,000 fit the
    # smaller window; the provider's count (~10,500) does not, and models before Claude 4.5 refuse
    # that with a 400 no code marks. Translated, litellm reads it as a context-length error and the
    # call moves on to the larger window; relayed, the 400 went back to the client.
    from tests.unit.inprocess import serving

    small = model(
        "small", fake.url, "context_window=20000,window_holds_output=1", protocol="anthropic", window=20_000,
        max_output_tokens=64_000,
    )  # fmt: skip
    big = model(
        "big", fake.url, protocol="anthropic", max_output_tokens=64_000, prices={"input": 5.0, "output": 10.0}
    )
    async with serving(tmp_path, [small, big]) as r:
        long = [{"role": "user", "content": "internationalization " * 2000}]
        served = await r.post(protocol, max_tokens=12_000, messages=long)
        assert served.status_code == 200, served.text
        assert served.headers["x-router-model"] == "big"
        tries = (await r.records())[-1].tries
    assert [(t.model, t.status) for t in tries] == [("small", 400), ("big", 200)]
