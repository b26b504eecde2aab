"""The in-process shared state (fake clock), the Redis guard's back-off, and ``open_state``.

The ``check_*`` scenarios take any ``SharedState`` and an ``Env`` (how to read and advance time),
so tests/integration/test_state_redis.py runs the very same ones against real Redis.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from router.errors import ConfigError, PermissionDenied, ServiceUnavailable
from router.shared import (
    AttemptMark,
    BreakerConfig,
    BreakerState,
    BudgetExceeded,
    MemoryState,
    Reservation,
    SharedState,
    Spend,
    StateConfig,
    StateUnavailable,
    open_state,
)
from router.shared.memory import TTLCache
from router.shared.redis_guard import RedisDown, RedisGuard


@dataclass
class Env:
    """Time as a scenario sees it: ``now()`` is comparable with ``Pin.until``."""

    now: Callable[[], float]
    advance: Callable[[float], Awaitable[None]]
    #: Slack for comparisons against a real clock (0 with a fake one).
    slack: float = 0.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    async def advance(self, seconds: float) -> None:
        self.t += seconds


# --- scenarios shared with the Redis integration tests -------------------------------------------


async def check_sessions(state: SharedState, env: Env, ttl: float) -> None:
    s = state.sessions
    assert await s.pin("task-1") is None
    await s.set_pin("task-1", "model-a", ttl)
    pin = await s.pin("task-1")
    assert pin is not None and pin.model == "model-a"
    assert pin.until == pytest.approx(env.now() + ttl, abs=env.slack + 1e-6)
    await s.set_pin("task-1", "model-b", ttl)
    replaced = await s.pin("task-1")
    assert replaced is not None and replaced.model == "model-b"
    assert await s.pin("task-2") is None

    await s.mark_warm("task-1", "backend-x", ttl / 2)
    warm = await s.warm("task-1")
    assert warm is not None and warm.model == "backend-x"
    assert warm.until == pytest.approx(env.now() + ttl / 2, abs=env.slack + 1e-6)
    await env.advance(ttl / 2 + env.slack + 0.01)
    assert await s.warm("task-1") is None
    assert await s.pin("task-1") is not None
    await env.advance(ttl / 2 + 0.01)
    assert await s.pin("task-1") is None
    with pytest.raises(ValueError):
        await s.set_pin("task-3", "m", 0)


async def check_attempts(a: SharedState, b: SharedState, env: Env, ttl: float) -> None:
    """A task's latest attempt, written by replica ``a``, as ``b`` reads it (the same state twice in process)."""
    assert await b.sessions.attempt("t") is None
    await a.sessions.count_call("t", 1, ttl)
    await a.sessions.count_call("t", 1, ttl)
    assert await b.sessions.attempt("t") == AttemptMark(1, calls=2)
    # A failure heard for the attempt, then the router's stop: the calls stay counted.
    await a.sessions.mark_attempt("t", 1, ttl, failed=True)
    assert await b.sessions.attempt("t") == AttemptMark(1, 2, failed=True)
    await a.sessions.mark_attempt("t", 1, ttl, failed=True, stop=("its 2 calls reached the cap", "cap"))
    assert await b.sessions.attempt("t") == AttemptMark(1, 2, True, ("its 2 calls reached the cap", "cap"))
    # The next attempt's first call starts it afresh; a late write about attempt 1 changes nothing.
    await a.sessions.count_call("t", 2, ttl)
    await a.sessions.count_call("t", 1, ttl)
    await a.sessions.mark_attempt("t", 1, ttl, failed=False)
    assert await b.sessions.attempt("t") == AttemptMark(2, calls=1)
    # An outcome about an attempt no replica served moves nothing: a client cannot push its task on.
    await a.sessions.mark_attempt("t", 50, ttl, failed=True)
    await a.sessions.mark_attempt("u", 1, ttl, failed=True)
    assert await b.sessions.attempt("t") == AttemptMark(2, calls=1) and await b.sessions.attempt("u") is None
    # The router's own stop of one does (its calls were counted a moment ago, perhaps not yet here).
    await a.sessions.mark_attempt("t", 3, ttl, failed=True, stop=("stopped", "stop_loss"))
    assert await b.sessions.attempt("t") == AttemptMark(3, 0, True, ("stopped", "stop_loss"))
    await env.advance(ttl + env.slack + 0.01)
    assert await b.sessions.attempt("t") is None


async def check_budgets(state: SharedState, env: Env) -> None:
    b = state.budgets
    limits = {"key": 1.0, "task": 0.5}
    r1 = await b.reserve(["key", "task", "key"], 0.3, limits)
    assert r1.scopes == ("key", "task")  # a repeated scope is charged once
    # What it holds, and until when (the default reservation TTL, 60 s: a crashed replica's holds lapse in a minute).
    assert r1.amount_usd == 0.3 and r1.expires_at == pytest.approx(env.now() + 60.0, abs=env.slack + 1e-6)
    assert await b.spent("key") == Spend(0.0, 0.3)

    with pytest.raises(BudgetExceeded) as info:
        await b.reserve(["key", "task"], 0.3, limits)
    assert info.value.scope == "task" and info.value.reserved_usd == pytest.approx(0.3)
    assert info.value.status == 403 and info.value.code == "budget_exceeded"
    assert await b.spent("key") == Spend(0.0, 0.3)  # all or nothing: "key" was not charged

    r2 = await b.reserve(["key", "other"], 0.6, limits)  # "other" has no limit but is counted
    assert await b.spent("other") == Spend(0.0, 0.6)
    await b.settle(r1, 0.25)
    assert await b.spent("key") == Spend(0.25, 0.6)
    assert await b.spent("task") == Spend(0.25, 0.0)
    await b.settle(r1, 0.25)  # once only
    await b.release(r1)
    assert await b.spent("task") == Spend(0.25, 0.0)
    await b.release(r2)
    assert await b.spent("key") == Spend(0.25, 0.0)
    assert await b.spent("other") == Spend(0.0, 0.0)
    await b.settle(r2, 0.6)  # released first: a later settle spends nothing
    assert await b.spent("key") == Spend(0.25, 0.0)

    # A refusal reports the scope's spend in USD: 0.25 spent + 0.3 asked > 0.5 (nothing held).
    with pytest.raises(BudgetExceeded) as info:
        await b.reserve(["task"], 0.3, limits)
    refused = info.value
    assert (refused.scope, refused.limit_usd, refused.amount_usd) == ("task", 0.5, 0.3)
    assert (refused.spent_usd, refused.reserved_usd) == (pytest.approx(0.25), 0.0)
    # It said "budget exceeded for task: limit $0.5000", also to a first request with nothing spent.
    # "estimated cost" was what it said of the hold: a Codex request whose tokens were estimated
    # at $0.000813 read "this request's estimated cost $0.010813" (its web search's fee held too).
    assert str(refused) == (
        "budget for task has no room for this request: limit $0.5, spent $0.25, "
        "held by requests in flight $0, this request would hold $0.3 (its cost with a long reply, and "
        "the fees of any hosted tools it declares)"
    )

    await b.reserve(["task"], 0.25, limits)  # exactly up to the limit
    with pytest.raises(BudgetExceeded):
        await b.reserve(["task"], 0.000_000_001, limits)

    r3 = await b.reserve(["over"], 0.1, {"over": 1.0})
    await b.settle(r3, 0.4)  # the actual cost may exceed the hold
    assert await b.spent("over") == Spend(0.4, 0.0)
    assert await b.spent("never-used") == Spend(0.0, 0.0)
    with pytest.raises(ValueError):
        await b.reserve(["key"], -1.0, limits)


async def check_more_in_some_scopes(state: SharedState) -> None:
    """A reservation may hold more in some of its scopes than in the others, all or nothing: a
    request's worst case in its key's budget, in one step with its hold in its task's."""
    b = state.budgets
    limits = {"key": 1.0, "task": 0.5}
    r1 = await b.reserve(["key", "task"], 0.2, limits, more={"key": 0.5})
    assert (r1.held_in("key"), r1.held_in("task"), r1.held_in("other")) == (0.7, 0.2, 0.0)
    assert [await b.spent(s) for s in ("key", "task")] == [Spend(0.0, 0.7), Spend(0.0, 0.2)]
    with pytest.raises(BudgetExceeded) as info:  # 0.2 more fits the task, 0.2 + 0.2 not the key
        await b.reserve(["key", "task"], 0.2, limits, more={"key": 0.2})
    assert (info.value.scope, info.value.amount_usd) == ("key", pytest.approx(0.4))
    assert [await b.spent(s) for s in ("key", "task")] == [Spend(0.0, 0.7), Spend(0.0, 0.2)]
    r2 = await b.reserve(["key", "task"], 0.0, limits, more={"key": 0.3, "task": 0.1})
    assert [await b.spent(s) for s in ("key", "task")] == [Spend(0.0, 1.0), Spend(0.0, pytest.approx(0.3))]
    await b.settle(r1, 0.1)  # the spend is the same in every scope; each hold goes
    await b.release(r2)
    assert [await b.spent(s) for s in ("key", "task")] == [Spend(0.1, 0.0), Spend(0.1, 0.0)]


async def check_upto_what_a_scope_has_room_for(state: SharedState) -> None:
    """A reservation may hold, in the same step, more on top as far as a scope has room for it:
    never refused for that part, and it says what it held. A request's worst case in its key's
    budget: held as far as the key had left when read, before the decision, a second request
    at once was refused where its hold fitted."""
    b = state.budgets
    limits = {"key": 1.0, "task": 0.5}
    r1 = await b.reserve(["key", "task"], 0.2, limits, upto={"key": 0.5, "other": 0.25})
    assert (r1.held_in("key"), r1.held_in("task")) == (pytest.approx(0.7), 0.2)
    r2 = await b.reserve(["key", "task"], 0.2, limits, upto={"key": 0.5, "task": 0.05})
    assert r2.more == {"key": pytest.approx(0.1), "task": pytest.approx(0.05)}  # the key's room
    r3 = await b.reserve(["key", "other"], 0.0, limits, more={"key": 0.0}, upto={"key": 0.1, "other": 0.25})
    assert r3.more == {"key": 0.0, "other": 0.25}  # none left in the key; no limit in the other
    assert [await b.spent(s) for s in ("key", "task", "other")] == [
        Spend(0.0, pytest.approx(1.0)), Spend(0.0, pytest.approx(0.45)), Spend(0.0, 0.25)
    ]  # fmt: skip
    with pytest.raises(BudgetExceeded) as info:  # what must be held is refused as before
        await b.reserve(["key"], 0.01, limits, upto={"key": 0.5})
    assert info.value.amount_usd == pytest.approx(0.01)
    await b.settle(r1, 0.3)  # each scope lets go of what it held, the spend the same in each
    await b.release(r2)
    await b.release(r3)
    assert [await b.spent(s) for s in ("key", "task", "other")] == [
        Spend(pytest.approx(0.3), 0.0), Spend(pytest.approx(0.3), 0.0), Spend(0.0, 0.0)
    ]  # fmt: skip


async def check_reservation_expiry(state: SharedState, env: Env, ttl: float) -> None:
    """A hold nobody settles (its replica died) stops counting after its TTL."""
    b = state.budgets
    lapsing = await b.reserve(["s"], 0.8, {"s": 1.0}, ttl_s=ttl)
    with pytest.raises(BudgetExceeded):
        await b.reserve(["s"], 0.3, {"s": 1.0})
    await env.advance(ttl + env.slack + 0.05)
    assert await b.spent("s") == Spend(0.0, 0.0)
    await b.reserve(["s"], 0.3, {"s": 1.0})
    await b.settle(lapsing, 0.5)  # a late settle still records what was really spent
    assert await b.spent("s") == Spend(0.5, 0.3)
    # A late release (a request that outlived its hold, then failed) is as harmless.
    outlived = await b.reserve(["t"], 0.4, {"t": 1.0}, ttl_s=ttl)
    await env.advance(ttl + env.slack + 0.05)
    await b.release(outlived)
    assert await b.spent("t") == Spend(0.0, 0.0)


async def check_reservation_renewal(state: SharedState, env: Env, ttl: float) -> None:
    """A hold renewed before it lapses counts for another TTL from then, in every scope; a lapsed,
    settled or released one is not made again by a renewal (which says so)."""
    b = state.budgets
    kept = await b.reserve(["s", "t"], 0.8, {"s": 1.0}, ttl_s=ttl)
    assert kept.ttl_s == ttl
    for _ in range(3):  # three TTLs in all, renewed at each half
        await env.advance(ttl / 2)
        assert await b.extend(kept)
        assert kept.expires_at == pytest.approx(env.now() + ttl, abs=env.slack + 1e-6)
    await env.advance(ttl / 2)
    assert await b.spent("s") == Spend(0.0, 0.8) and await b.spent("t") == Spend(0.0, 0.8)
    with pytest.raises(BudgetExceeded):
        await b.reserve(["s"], 0.3, {"s": 1.0})
    await env.advance(ttl / 2 + env.slack + 0.05)  # not renewed since: it lapses
    assert await b.spent("s") == Spend(0.0, 0.0)
    assert not await b.extend(kept)
    assert await b.spent("s") == Spend(0.0, 0.0) and await b.spent("t") == Spend(0.0, 0.0)
    settled = await b.reserve(["s"], 0.5, {"s": 1.0}, ttl_s=ttl)
    released = await b.reserve(["s"], 0.5, {"s": 1.0}, ttl_s=ttl)
    await b.settle(settled, 0.25)
    await b.release(released)
    assert not await b.extend(settled) and not await b.extend(released)
    assert await b.spent("s") == Spend(0.25, 0.0)


async def check_no_overspend(states: Sequence[SharedState], n: int = 200, limit: float = 0.5) -> None:
    """``n`` concurrent reserves (spread over ``states``, e.g. two replicas) against a small budget,
    while a sampler watches spent + reserved; then settles below the hold and a second wave."""
    rng = random.Random(7)
    amounts = [rng.choice([0.007, 0.01, 0.013, 0.021]) for _ in range(2 * n)]
    peak = 0.0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            u = await states[-1].budgets.spent("tiny")
            peak = max(peak, u.spent + u.reserved)
            await asyncio.sleep(0)

    async def one(i: int) -> tuple[int, Reservation] | None:
        st = states[i % len(states)]
        try:
            return i, await st.budgets.reserve(["tiny", f"task-{i % 7}"], amounts[i], {"tiny": limit})
        except BudgetExceeded:
            return None

    sampler = asyncio.create_task(sample())
    first = [r for r in await asyncio.gather(*(one(i) for i in range(n))) if r is not None]
    held = sum(amounts[i] for i, _ in first)
    assert 0 < held <= limit + 1e-9
    refused = set(range(n)) - {i for i, _ in first}
    assert refused  # the budget really was the constraint...
    assert limit - held < min(amounts[i] for i in refused) - 1e-9  # ...and no capacity was lost
    u = await states[0].budgets.spent("tiny")
    assert u.spent == 0 and u.reserved == pytest.approx(held)

    async def settle(i: int, res: Reservation) -> None:
        await states[i % len(states)].budgets.settle(res, amounts[i] / 2)

    second = await asyncio.gather(*(settle(i, r) for i, r in first), *(one(i) for i in range(n, 2 * n)))
    stop.set()
    await sampler
    accepted = [r for r in second if r is not None]
    spent = sum(amounts[i] / 2 for i, _ in first)
    reserved = sum(amounts[i] for i, _ in accepted)
    u = await states[1 % len(states)].budgets.spent("tiny")
    assert u.spent == pytest.approx(spent) and u.reserved == pytest.approx(reserved)
    assert u.spent + u.reserved <= limit + 1e-9
    assert peak <= limit + 1e-9


async def check_rate_limits(state: SharedState, env: Env, window: float) -> None:
    lim = state.limits
    for _ in range(3):
        assert await lim.check_and_consume("k1", rpm=3, tpm=None)
    v = await lim.check_and_consume("k1", rpm=3, tpm=None)
    assert not v and v.reason == "rpm" and 0 < v.retry_after_s <= window + env.slack
    assert await lim.check_and_consume("k2", rpm=3, tpm=None)  # keys are independent

    assert await lim.check_and_consume("k3", tokens=60, rpm=None, tpm=100)
    v = await lim.check_and_consume("k3", tokens=50, rpm=None, tpm=100)
    assert not v and v.reason == "tpm"
    assert await lim.check_and_consume("k3", tokens=40, rpm=None, tpm=100)  # a refusal took nothing
    v = await lim.check_and_consume("k3", tokens=101, rpm=None, tpm=100)
    assert not v and v.reason == "too_large" and math.isinf(v.retry_after_s)
    await lim.adjust("k3", -50)  # the real count was lower than the estimate
    assert await lim.check_and_consume("k3", tokens=50, rpm=None, tpm=100)
    assert not await lim.check_and_consume("k3", tokens=1, rpm=None, tpm=100)
    await lim.adjust("k3", 30)  # ... or higher: the window is over the limit now
    assert not await lim.check_and_consume("k3", tokens=0, rpm=None, tpm=100)

    # Sliding, not fixed: events leave the window one by one, in order.
    assert await lim.check_and_consume("k4", rpm=3, tpm=None)
    assert await lim.check_and_consume("k4", rpm=3, tpm=None)
    await env.advance(window / 2)
    assert await lim.check_and_consume("k4", rpm=3, tpm=None)
    await env.advance(window / 2 + env.slack + 0.01)
    assert await lim.check_and_consume("k4", rpm=3, tpm=None)
    assert await lim.check_and_consume("k4", rpm=3, tpm=None)
    v = await lim.check_and_consume("k4", rpm=3, tpm=None)
    assert not v and v.retry_after_s == pytest.approx(window / 2 - 0.01, abs=2 * env.slack + 1e-6)


async def check_breaker(state: SharedState, env: Env, cooldown: float) -> None:
    """Expects ``failure_threshold=3``."""
    br, b = state.breakers, "backend-1"
    assert await br.before_call(b) and await br.state(b) == BreakerState.CLOSED
    for _ in range(2):
        await br.record_failure(b, True)
    await br.record_success(b)  # consecutive: a success resets the count
    for _ in range(2):
        await br.record_failure(b, True)
    for _ in range(5):
        await br.record_failure(b, False)  # the backend answered (4xx): not counted
    assert await br.state(b) == BreakerState.CLOSED
    await br.record_failure(b, True)
    assert await br.state(b) == BreakerState.OPEN
    assert not await br.before_call(b)
    await br.record_success(b)  # a straggler from before it opened: the cool-down stands
    assert await br.state(b) == BreakerState.OPEN

    await env.advance(cooldown + env.slack + 0.01)
    assert await br.state(b) == BreakerState.HALF_OPEN
    admitted = await asyncio.gather(*(br.before_call(b) for _ in range(20)))
    assert sum(admitted) == 1  # exactly one probe
    await br.record_failure(b, True)  # the probe failed: open again
    assert await br.state(b) == BreakerState.OPEN and not await br.before_call(b)

    await env.advance(cooldown + env.slack + 0.01)
    assert await br.before_call(b) and not await br.before_call(b)
    await br.record_failure(b, False)  # a 4xx answer frees the probe slot...
    assert await br.state(b) == BreakerState.HALF_OPEN
    assert await br.before_call(b) and not await br.before_call(b)  # ...for one new probe
    await br.record_success(b)
    assert await br.state(b) == BreakerState.CLOSED
    assert all(await asyncio.gather(*(br.before_call(b) for _ in range(5))))
    assert await br.state("other-backend") == BreakerState.CLOSED


async def check_breaker_suspects(state: SharedState, env: Env, cooldown: float) -> None:
    """Failures a request may have caused (``caused_by``); expects ``failure_threshold=3``."""
    br, b = state.breakers, "backend-2"
    for _ in range(10):
        await br.record_failure(b, True, caused_by="key-a")  # one tenant's count once
    await br.record_failure(b, True)  # and with the backend's own failures, as one
    assert await br.state(b) == BreakerState.CLOSED
    await br.record_failure(b, True, caused_by="key-b")  # a second tenant's: each counts
    assert await br.state(b) == BreakerState.OPEN
    await env.advance(cooldown + env.slack + 0.01)
    assert await br.before_call(b) and not await br.before_call(b)
    await br.record_failure(b, True, caused_by="key-a")  # a probe's own long reply: no evidence
    assert await br.state(b) == BreakerState.HALF_OPEN
    assert await br.before_call(b)  # the slot is free for another probe
    await br.record_success(b)
    for key in ("key-a", "key-b"):
        await br.record_failure(b, True, caused_by=key)
    await br.record_success(b)  # a success ends the row, the tenants seen with it
    for _ in range(2):
        await br.record_failure(b, True, caused_by="key-b")
    await br.record_failure(b, True)
    assert await br.state(b) == BreakerState.CLOSED
    await br.record_failure(b, True)
    assert await br.state(b) == BreakerState.OPEN


async def check_policy_watch(publisher: SharedState, watcher: SharedState, within: float) -> None:
    seen: list[str] = []
    changed = asyncio.Event()

    async def on_version(version: str) -> None:
        seen.append(version)
        changed.set()

    async def wait_for(expected: list[str]) -> None:
        async with asyncio.timeout(within):
            while seen != expected:
                changed.clear()
                await changed.wait()

    assert await watcher.policy.current_version() is None
    await publisher.policy.publish_version("v1")
    task = asyncio.create_task(watcher.policy.watch(on_version))
    try:
        await wait_for(["v1"])  # published before the watch started: read at start
        await publisher.policy.publish_version("v2")
        await wait_for(["v1", "v2"])
        await publisher.policy.publish_version("v2")
        await asyncio.sleep(0.05)
        assert seen == ["v1", "v2"]  # only changes are reported
        assert await watcher.policy.current_version() == "v2"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    quiet: list[str] = []

    async def on_quiet(version: str) -> None:
        quiet.append(version)

    task = asyncio.create_task(watcher.policy.watch(on_quiet, known="v2"))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert quiet == []


# --- the in-process implementation --------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def env(clock: FakeClock) -> Env:
    return Env(now=clock, advance=clock.advance)


def memory(clock: FakeClock, **config: Any) -> MemoryState:
    return MemoryState(StateConfig(**config), clock=clock)


async def test_sessions(clock: FakeClock, env: Env) -> None:
    await check_sessions(memory(clock), env, ttl=60.0)


async def test_attempts(clock: FakeClock, env: Env) -> None:
    state = memory(clock)
    await check_attempts(state, state, env, ttl=60.0)


async def test_budgets(clock: FakeClock, env: Env) -> None:
    await check_budgets(memory(clock), env)


async def test_more_in_some_scopes(clock: FakeClock) -> None:
    await check_more_in_some_scopes(memory(clock))


async def test_upto_what_a_scope_has_room_for(clock: FakeClock) -> None:
    await check_upto_what_a_scope_has_room_for(memory(clock))


async def test_reservation_expiry(clock: FakeClock, env: Env) -> None:
    await check_reservation_expiry(memory(clock), env, ttl=30.0)


async def test_reservation_renewal(clock: FakeClock, env: Env) -> None:
    await check_reservation_renewal(memory(clock), env, ttl=30.0)


async def test_a_hold_counts_for_exactly_its_ttl(clock: FakeClock) -> None:
    b = memory(clock).budgets
    await b.reserve(["s"], 0.8, {"s": 1.0}, ttl_s=30.0)
    await clock.advance(29.5)
    assert await b.spent("s") == Spend(0.0, 0.8)
    await clock.advance(0.5)
    assert await b.spent("s") == Spend(0.0, 0.0)
    await b.reserve(["s"], 1.0, {"s": 1.0})  # the whole budget is free again


async def test_a_hold_is_renewed_in_its_scopes_still_kept_when_one_was_dropped(clock: FakeClock) -> None:
    """A task's scope may be dropped for room while its request runs: the renewal still renews
    the hold in the request's other scopes, its key's here (past the TTL it was made with)."""
    b = memory(clock, local_max_entries=1).budgets
    held = await b.reserve(["task:t", "key:k"], 0.5, {"key:k": 1.0}, ttl_s=10.0)
    await b.reserve(["task:u"], 0.1, {})  # the task's scope goes for room
    assert await b.spent("task:t") == Spend(0.0, 0.0)
    await clock.advance(8.0)
    assert await b.extend(held)
    await clock.advance(8.0)
    assert await b.spent("key:k") == Spend(0.0, 0.5)


def test_a_task_scope_is_looked_up_in_the_log_once_one_was_dropped_for_room(clock: FakeClock) -> None:
    """``forgotten``: whether admission must read a scope's spend back from the log. Not before
    any scope was dropped for room (the start restored every one: no read per new task), then
    for any task's scope not held, from the first dropped on; never for a key's."""
    b = memory(clock, local_max_entries=2).budgets
    b.restore({"task:a": 0.1, "task:b": 0.1, "key:k": 0.1})
    assert not b.forgotten("task:new")
    b.restore({"task:c": 0.1})  # "task:a" goes, the least recently used
    assert b.forgotten("task:a") and b.forgotten("task:new")
    assert not b.forgotten("task:b") and not b.forgotten("task:c") and not b.forgotten("key:k")


async def test_no_overspend(clock: FakeClock) -> None:
    await check_no_overspend([memory(clock)])


async def test_rate_limits(clock: FakeClock, env: Env) -> None:
    await check_rate_limits(memory(clock, rate_window_s=60.0), env, window=60.0)


async def test_breaker(clock: FakeClock, env: Env) -> None:
    state = memory(clock, breaker=BreakerConfig(failure_threshold=3, cooldown_s=30.0))
    await check_breaker(state, env, cooldown=30.0)
    await check_breaker_suspects(state, env, cooldown=30.0)


async def test_breaker_probe_that_never_reports_frees_its_slot(clock: FakeClock) -> None:
    state = memory(clock, breaker=BreakerConfig(failure_threshold=1, cooldown_s=10.0, probe_ttl_s=5.0))
    await state.breakers.record_failure("b", True)
    await clock.advance(10.0)
    assert await state.breakers.before_call("b")
    await clock.advance(4.9)
    assert not await state.breakers.before_call("b")
    await clock.advance(0.2)
    assert await state.breakers.before_call("b")


async def test_policy_watch() -> None:
    state = MemoryState()
    await check_policy_watch(state, state, within=1.0)


async def test_policy_watch_survives_a_failing_callback() -> None:
    state = MemoryState()
    good: list[str] = []

    async def bad(version: str) -> None:
        raise RuntimeError("boom")

    async def ok(version: str) -> None:
        good.append(version)

    tasks = [asyncio.create_task(state.policy.watch(cb)) for cb in (bad, ok)]
    await asyncio.sleep(0)
    await state.policy.publish_version("v9")
    assert good == ["v9"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await state.policy.publish_version("v10")  # cancelled watchers are unregistered
    assert good == ["v9"]


async def test_memory_state_is_never_degraded() -> None:
    state = MemoryState()
    assert not state.degraded and await state.ping() and state.last_error is None
    assert dict(state.fail_open_counts) == {} == dict(state.fail_closed_counts)
    await state.aclose()


def test_ttl_cache_evicts_least_recently_used_and_expired(clock: FakeClock) -> None:
    cache: TTLCache[int] = TTLCache(2, clock)
    cache.set("a", 1, 10)
    cache.set("b", 2, 10)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.set("c", 3, 10)
    assert cache.get("b") is None and cache.get("a") == 1 and len(cache) == 2
    clock.t += 10
    assert cache.get("a") is None and len(cache) == 1


async def test_bounded_maps(clock: FakeClock) -> None:
    state = memory(clock, local_max_entries=10)
    for i in range(100):
        await state.sessions.set_pin(f"t{i}", "m", 60)
        assert await state.limits.check_and_consume(f"k{i}", rpm=1, tpm=None)
    assert await state.sessions.pin("t0") is None and await state.sessions.pin("t99") is not None
    assert await state.limits.check_and_consume("k0", rpm=1, tpm=None)  # forgotten: evicted
    assert not await state.limits.check_and_consume("k99", rpm=1, tpm=None)


# --- open_state ---------------------------------------------------------------------------------


async def test_open_state_picks_the_implementation() -> None:
    assert isinstance(open_state(None), MemoryState)
    assert isinstance(open_state(""), MemoryState)
    from router.shared.redis import RedisState

    state = open_state("redis://127.0.0.1:1/0")  # no I/O until first use
    assert isinstance(state, RedisState)
    await state.aclose()


def test_open_state_rejects_a_bad_url_without_echoing_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        open_state("http://user:s3cret@127.0.0.1:6379")
    assert "s3cret" not in str(info.value)


def test_errors_fit_the_tree() -> None:
    assert issubclass(BudgetExceeded, PermissionDenied)
    err = StateUnavailable("budget check", "ConnectionError: 10.0.0.5:6379 refused")
    assert isinstance(err, ServiceUnavailable) and err.status == 503 and err.code == "state_unavailable"
    assert "10.0.0.5" not in err.message and "10.0.0.5" in err.reason


# --- the Redis guard (no Redis needed) ----------------------------------------------------------


async def test_guard_backs_off_after_a_failure_then_tries_again() -> None:
    t = [100.0]
    guard = RedisGuard(op_timeout_s=0.5, backoff_s=1.0, clock=lambda: t[0])
    calls = 0

    async def failing() -> str:
        nonlocal calls
        calls += 1
        raise RedisConnectionError("refused")

    async def working() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    async def local() -> str:
        return "local"

    assert await guard.fail_open("sessions", failing, local) == "local"
    assert guard.degraded and calls == 1
    assert await guard.fail_open("sessions", working, local) == "local"  # skipped: in back-off
    assert calls == 1 and guard.fail_open_counts == {"sessions": 2}
    with pytest.raises(StateUnavailable):
        await guard.fail_closed("budgets", "budget check", working)
    assert guard.fail_closed_counts == {"budgets": 1}
    t[0] += 1.01
    assert await guard.fail_open("sessions", working, local) == "ok"
    assert calls == 2 and not guard.degraded


async def test_guard_caps_every_call() -> None:
    guard = RedisGuard(op_timeout_s=0.05, backoff_s=1.0)

    async def hangs() -> None:
        await asyncio.sleep(5)

    start = time.monotonic()
    with pytest.raises(RedisDown):
        await guard.run(hangs)
    assert time.monotonic() - start < 0.5 and guard.degraded
