"""A request holds its budget for as long as it runs, however long that is.

Holds lapse after ``reservation_ttl_s`` so that a crashed replica's free themselves; a stream (or
a slow whole reply) that ran longer lost its hold while still running, and other requests spent
the same money. Here the TTL is two seconds and the requests run eight.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.http.admission import Admission
from router.shared import MemoryState, SharedState, Spend, StateConfig, open_state
from tests.integration.conftest import RunningRouter
from tests.integration.tcpproxy import TcpProxy
from tests.integration.test_faults import HI, faulty
from tests.integration.test_keys import MASTER, create_key
from tests.integration.test_money import REDIS_PORT, SLOW, flush_prefix

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]
CHAT = "/v1/chat/completions"
#: Renewed every second: a loaded machine's stalls of the event loop stay well within the rest.
TTL_S = 2.0
#: Both run about four TTLs: ten deltas 800 ms apart, or a reply that starts after 8 s.
SLOW_STREAM = "chunk_ms=800,chunks=10"
SLOW_REPLY = "ttft_ms=8000"


@pytest.fixture(params=["memory", "redis"])
def short_holds(request: pytest.FixtureRequest) -> Iterator[Callable[[], SharedState]]:
    """The budgets' store, in process or in Redis, with holds that lapse after ``TTL_S``."""
    prefix = f"test:{uuid.uuid4().hex[:8]}:"

    def make() -> SharedState:
        if request.param == "memory":
            return MemoryState(StateConfig(reservation_ttl_s=TTL_S))
        config = StateConfig(prefix=prefix, reservation_ttl_s=TTL_S, op_timeout_s=2.0, socket_timeout_s=1.0,
                             connect_timeout_s=1.0, pool_timeout_s=1.0)  # fmt: skip
        return open_state(f"redis://127.0.0.1:{REDIS_PORT}/0", config)

    yield make
    with redis.Redis(port=REDIS_PORT) as r:
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)


def ask(r: RunningRouter, key: str, task: str, **body: Any) -> httpx.Response:
    return httpx.post(r.url + CHAT, json={"model": "solo", "messages": HI, **body},
                      headers={"x-api-key": key, "x-router-task-id": task}, timeout=30)  # fmt: skip


@pytest.mark.parametrize("slow", [SLOW_STREAM, SLOW_REPLY], ids=["stream", "whole-reply"])
def test_a_request_that_outlives_the_hold_ttl_keeps_its_hold(
    router_factory: Factory,
    upstream: FakeUpstream,
    capsys: pytest.CaptureFixture[str],
    short_holds: Callable[[], SharedState],
    slow: str,
) -> None:
    state = short_holds()

    def swap(s: Services) -> None:
        s.state = state

    r = router_factory(faulty(upstream, slow), master_key=MASTER, services_hook=swap, timeouts=SLOW)
    seen = httpx.post(r.url + "/v1/route", json={"model": "solo", "messages": HI},
                      headers={"x-api-key": MASTER}, timeout=30).json()  # fmt: skip
    hold = seen["candidates"][0].get("hold_usd", seen["candidates"][0]["cost_usd"])
    # Room for the first request's hold and more than another's: only the first's worst case (what
    # its output may cost at most, held in the key's budget too) leaves none for a second.
    key = create_key(r, capsys, "--name", "long-runner", "--budget", str(2.5 * hold))
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        first = pool.submit(ask, r, key["key"], "first", stream=slow == SLOW_STREAM)
        time.sleep(2.5 * TTL_S)  # the first still runs, past its hold's TTL
        second = ask(r, key["key"], "second")
        assert time.monotonic() - started < 3.5 * TTL_S, "the first request ended before the second was asked"
        assert first.result().status_code == 200
    assert second.status_code == 429, "the first request's hold lapsed while it ran: a second was admitted"
    assert second.json()["error"]["code"] == "budget_held"
    # What it held is given back when it ends, and its renewal stops with it: nothing is held
    # a TTL later (a hold still renewed would keep the key's money from later requests).
    time.sleep(1.5 * TTL_S)
    assert ask(r, key["key"], "third").status_code == 200


async def test_a_hold_outlives_a_redis_outage_at_its_renewal() -> None:
    """A renewal that could not reach Redis was tried again half a TTL later, as the hold lapsed:
    an outage of a fraction of a second at the renewal freed the money of a request still
    running. It is now tried again every ``retry_s`` and lands once Redis is back."""
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    proxy = TcpProxy(REDIS_PORT).start()
    config = StateConfig(prefix=prefix, reservation_ttl_s=TTL_S, op_timeout_s=0.3, socket_timeout_s=0.2,
                         connect_timeout_s=0.2, pool_timeout_s=0.2, backoff_s=0.1)  # fmt: skip
    state = open_state(f"redis://127.0.0.1:{proxy.port}/0", config)
    direct = open_state(f"redis://127.0.0.1:{REDIS_PORT}/0", StateConfig(prefix=prefix, op_timeout_s=2.0))
    try:
        held = await state.budgets.reserve(["key:k"], 0.5, {"key:k": 1.0})
        gate = Admission(state.limits, state.budgets, retry_s=0.1)
        keeping = asyncio.create_task(gate.keep(lambda: [held]))
        await asyncio.sleep(0.4 * TTL_S)
        proxy.stop()  # away from 0.4 to 0.6 TTL: the renewal at half the TTL fails
        await asyncio.sleep(0.2 * TTL_S)
        proxy.start()
        await asyncio.sleep(0.6 * TTL_S)  # past the TTL the hold was made with
        assert await direct.budgets.spent("key:k") == Spend(0.0, 0.5), "the hold lapsed while its request ran"
        keeping.cancel()
    finally:
        proxy.stop()
        await state.aclose()
        await direct.aclose()
        flush_prefix(prefix)
