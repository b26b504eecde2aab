"""The Redis shared state against the machine's real Redis: each component, two replicas (two
clients) sharing one server, and the failure behaviour (dead port, silent server, a restart).

The server is ``ROUTER_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Every test works
under its own key prefix, deleted afterwards; nothing here stops or flushes the shared server (the
restart test restarts a TCP proxy in front of it instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis

from router.shared import BreakerConfig, BreakerState, StateConfig, StateUnavailable, open_state
from router.shared.redis import RedisState
from tests.unit.test_state_memory import (
    Env,
    check_attempts,
    check_breaker,
    check_breaker_suspects,
    check_budgets,
    check_more_in_some_scopes,
    check_no_overspend,
    check_policy_watch,
    check_rate_limits,
    check_reservation_expiry,
    check_reservation_renewal,
    check_sessions,
    check_upto_what_a_scope_has_room_for,
)

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REAL = Env(now=time.time, advance=asyncio.sleep, slack=0.05)

MakeState = Callable[..., RedisState]


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    p = f"router-test:{uuid.uuid4().hex[:12]}:"
    yield p
    admin = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        keys = [k async for k in admin.scan_iter(match=p + "*", count=500)]
        if keys:
            await admin.delete(*keys)
    finally:
        await admin.aclose()


#: Timeouts for the tests that are about semantics, not failure: a loaded CI machine can stall
#: the event loop past the production defaults, and one timeout puts a replica in back-off.
RELAXED: dict[str, Any] = {
    "socket_timeout_s": 2.0,
    "connect_timeout_s": 2.0,
    "pool_timeout_s": 2.0,
    "op_timeout_s": 3.0,
}


@pytest.fixture
async def make_state(prefix: str) -> AsyncIterator[MakeState]:
    """A replica's state over ``url`` (the test server by default), closed afterwards. Relaxed
    timeouts unless ``strict`` (the production defaults, for the failure tests)."""
    made: list[RedisState] = []

    def make(url: str = REDIS_URL, *, strict: bool = False, **config: Any) -> RedisState:
        state = open_state(url, StateConfig(prefix=prefix, **({} if strict else RELAXED), **config))
        assert isinstance(state, RedisState)
        made.append(state)
        return state

    yield make
    for state in made:
        await state.aclose()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- each component -----------------------------------------------------------------------------


async def test_sessions(make_state: MakeState) -> None:
    state = make_state()
    await check_sessions(state, REAL, ttl=0.4)
    assert not state.degraded and dict(state.fail_open_counts) == {}


async def test_attempts_written_by_one_replica_are_read_by_another(make_state: MakeState) -> None:
    # Two clients: what ``b`` reads comes from Redis, not from ``a``'s local mirror.
    a, b = make_state(), make_state()
    await check_attempts(a, b, REAL, ttl=0.4)
    assert not a.degraded and dict(b.fail_open_counts) == {}


async def test_budgets(make_state: MakeState) -> None:
    await check_budgets(make_state(), REAL)


async def test_more_in_some_scopes(make_state: MakeState) -> None:
    await check_more_in_some_scopes(make_state())


async def test_upto_what_a_scope_has_room_for(make_state: MakeState) -> None:
    await check_upto_what_a_scope_has_room_for(make_state())


async def test_reservation_of_a_dead_replica_expires(make_state: MakeState) -> None:
    await check_reservation_expiry(make_state(), REAL, ttl=0.2)


async def test_a_renewed_reservation_outlives_its_ttl(make_state: MakeState) -> None:
    await check_reservation_renewal(make_state(), REAL, ttl=1.0)


async def test_rate_limits(make_state: MakeState) -> None:
    await check_rate_limits(make_state(rate_window_s=1.0), REAL, window=1.0)


async def test_breaker(make_state: MakeState) -> None:
    state = make_state(breaker=BreakerConfig(failure_threshold=3, cooldown_s=0.2))
    await check_breaker(state, REAL, cooldown=0.2)
    await check_breaker_suspects(state, REAL, cooldown=0.2)


async def test_policy_version_reaches_another_replica_within_a_second(make_state: MakeState) -> None:
    await check_policy_watch(make_state(), make_state(), within=1.0)


async def test_large_budgets_stay_exact(make_state: MakeState) -> None:
    """Sums beyond 1e14 nano-USD must not turn into Lua's exponent notation."""
    b = make_state().budgets
    r = await b.reserve(["big"], 250_000.123456789, {"big": 1_000_000.0})
    await b.settle(r, 250_000.123456789)
    assert (await b.spent("big")).spent == 250_000.123456789


# --- two replicas sharing one Redis -------------------------------------------------------------


async def test_no_overspend_under_200_concurrent_reserves_from_two_replicas(make_state: MakeState) -> None:
    await check_no_overspend([make_state(), make_state()], n=200, limit=0.5)


async def test_replicas_share_pins_affinity_and_breakers(make_state: MakeState) -> None:
    a = make_state(breaker=BreakerConfig(failure_threshold=2, cooldown_s=0.2))
    b = make_state(breaker=BreakerConfig(failure_threshold=2, cooldown_s=0.2))
    await a.sessions.set_pin("task-9", "model-a", 30)
    await a.sessions.mark_warm("task-9", "backend-a", 30)
    pin, warm = await b.sessions.pin("task-9"), await b.sessions.warm("task-9")
    assert pin is not None and pin.model == "model-a"
    assert warm is not None and warm.model == "backend-a"

    await a.breakers.record_failure("flaky", True)
    await b.breakers.record_failure("flaky", True)  # consecutive across replicas
    assert not await b.breakers.before_call("flaky") and not await a.breakers.before_call("flaky")
    await asyncio.sleep(0.25)
    probes = await asyncio.gather(*(s.breakers.before_call("flaky") for s in (a, b) for _ in range(10)))
    assert sum(probes) == 1
    await b.breakers.record_success("flaky")
    assert await a.breakers.state("flaky") == BreakerState.CLOSED

    assert await a.limits.check_and_consume("key-1", rpm=1, tpm=None)
    refused = await b.limits.check_and_consume("key-1", rpm=1, tpm=None)
    assert not refused and refused.reason == "rpm"


async def test_watcher_that_missed_the_message_catches_up_by_polling(
    make_state: MakeState, prefix: str
) -> None:
    watcher = make_state(poll_interval_s=0.2)
    seen: list[str] = []
    arrived = asyncio.Event()

    async def on_version(version: str) -> None:
        seen.append(version)
        arrived.set()

    task = asyncio.create_task(watcher.policy.watch(on_version))
    try:
        await asyncio.sleep(0.1)
        raw = Redis.from_url(REDIS_URL, decode_responses=True)
        await raw.set(f"{prefix}policy:version", "silent-v7")  # SET without PUBLISH
        await raw.aclose()
        async with asyncio.timeout(1.0):
            await arrived.wait()
        assert seen == ["silent-v7"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- failure behaviour --------------------------------------------------------------------------


async def test_unreachable_redis_budgets_fail_closed_the_rest_fail_open(make_state: MakeState) -> None:
    state = make_state(f"redis://127.0.0.1:{closed_port()}/0", strict=True)
    start = time.monotonic()
    with pytest.raises(StateUnavailable) as info:
        await state.budgets.reserve(["key"], 0.01, {"key": 1.0})
    assert info.value.status == 503 and "127.0.0.1" not in info.value.message
    assert "127.0.0.1" in info.value.reason  # the operator's log gets the details
    with pytest.raises(StateUnavailable):
        await state.budgets.spent("key")
    assert state.degraded and not await state.ping()

    await state.sessions.set_pin("t", "model-x", 30)
    pin = await state.sessions.pin("t")
    assert pin is not None and pin.model == "model-x"  # this replica's own copy
    assert await state.limits.check_and_consume("k", rpm=1, tpm=None)
    assert not await state.limits.check_and_consume("k", rpm=1, tpm=None)  # still limited, locally
    assert await state.breakers.before_call("b")
    await state.breakers.record_failure("b", True)
    assert await state.policy.current_version() is None
    with pytest.raises(StateUnavailable):
        await state.policy.publish_version("v1")
    assert time.monotonic() - start < 1.0
    assert dict(state.fail_open_counts) == {"sessions": 2, "rate_limits": 2, "breakers": 2, "policy": 1}
    assert dict(state.fail_closed_counts) == {"budgets": 2, "policy": 1}


async def test_silent_redis_costs_one_timeout_per_backoff_window(make_state: MakeState) -> None:
    """A server that accepts connections and never answers: calls end at the timeouts, and
    during the back-off window they do not wait at all."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        state = make_state(f"redis://127.0.0.1:{port}/0", strict=True, backoff_s=1.0)
        start = time.monotonic()
        with pytest.raises(StateUnavailable):
            await state.budgets.reserve(["key"], 0.01, {"key": 1.0})
        first = time.monotonic() - start
        assert 0.2 < first < 0.8  # the socket timeout (0.3 s) fired, under op_timeout_s
        start = time.monotonic()
        with pytest.raises(StateUnavailable):
            await state.budgets.reserve(["key"], 0.01, {"key": 1.0})
        assert await state.sessions.pin("t") is None
        assert time.monotonic() - start < 0.05
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


class RestartableProxy:
    """A TCP relay in front of the test Redis that can be stopped and started on the same port:
    to the client, exactly a Redis restart, without touching the shared server."""

    def __init__(self, target: str) -> None:
        u = urlparse(target)
        self._target = (u.hostname or "127.0.0.1", u.port or 6379)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()
        await asyncio.sleep(0.05)  # let the relay tasks see their sockets go

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, up_writer}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


async def test_recovers_when_redis_comes_back(make_state: MakeState) -> None:
    proxy = RestartableProxy(REDIS_URL)
    await proxy.start()
    url = f"redis://127.0.0.1:{proxy.port}/0"
    # A poll far beyond the test's time: the version can only arrive through the re-subscription.
    state = make_state(url, strict=True, backoff_s=0.3, poll_interval_s=30.0)
    direct = make_state()  # another replica, never cut off
    seen: list[str] = []
    arrived = asyncio.Event()

    async def on_version(version: str) -> None:
        seen.append(version)
        if version == "after-restart":
            arrived.set()

    watch = asyncio.create_task(state.policy.watch(on_version))
    try:
        await state.sessions.set_pin("t", "model-1", 30)
        assert await state.ping() and not state.degraded

        await proxy.stop()
        with pytest.raises(StateUnavailable):
            await state.budgets.reserve(["key"], 0.01, {"key": 1.0})
        assert state.degraded
        await proxy.start()
        with pytest.raises(StateUnavailable):  # still inside the back-off window
            await state.budgets.reserve(["key"], 0.01, {"key": 1.0})

        await direct.policy.publish_version("after-restart")
        await direct.sessions.set_pin("t2", "model-2", 30)
        await asyncio.sleep(0.35)
        held = await state.budgets.reserve(["key"], 0.01, {"key": 1.0})  # Redis again, no restart
        assert not state.degraded
        assert (await direct.budgets.spent("key")).reserved == pytest.approx(0.01)
        await state.budgets.release(held)
        pin = await state.sessions.pin("t2")
        assert pin is not None and pin.model == "model-2"  # read from Redis, not local state
        async with asyncio.timeout(1.0):
            await arrived.wait()
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await proxy.stop()
