"""A key's budget is money the operator capped: it lasts however long the key stays quiet, across
restarts of the router and of Redis, and however many tasks pass through meanwhile. Task budgets
may still be forgotten once their task has long ended.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.shared import MemoryState, StateConfig
from router.shared.redis_keys import Keys
from tests.integration.conftest import RunningRouter
from tests.integration.test_faults import HI, faulty
from tests.integration.test_keys import MASTER, create_key
from tests.integration.test_money import REDIS_PORT, SLOW, flush_prefix, redis_router

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]
CHAT = "/v1/chat/completions"
DAY = 86400.0


def ask(r: RunningRouter, key: str, task: str) -> httpx.Response:
    return httpx.post(r.url + CHAT, json={"model": "solo", "messages": HI},
                      headers={"x-api-key": key, "x-router-task-id": task}, timeout=30)  # fmt: skip


def spend_until_refused(r: RunningRouter, key: str) -> list[int]:
    statuses: list[int] = []
    while 403 not in statuses:
        statuses.append(ask(r, key, f"t{len(statuses)}").status_code)
        assert len(statuses) < 20, statuses
    return statuses


def age_log(db: Path, days: float) -> None:
    """The log as it reads ``days`` later: every request that far in the past."""
    con = sqlite3.connect(db)
    try:
        con.execute("UPDATE requests SET ts = ts - ?", (days * DAY,))
        con.commit()
    finally:
        con.close()


def small_budget(r: RunningRouter, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """A key with room for the hold of a call of ``solo`` and about two calls' actual cost."""
    seen = httpx.post(r.url + "/v1/route", json={"model": "solo", "messages": HI},
                      headers={"x-api-key": MASTER}, timeout=30).json()  # fmt: skip
    hold = seen["candidates"][0].get("hold_usd", seen["candidates"][0]["cost_usd"])
    cost = float(ask(r, MASTER, "price").headers["x-router-cost-usd"])
    return create_key(
        r, capsys, "--name", f"quiet-{uuid.uuid4().hex[:6]}", "--budget", str(hold + 2.5 * cost)
    )


def test_a_key_quiet_for_41_days_keeps_its_spend_across_a_restart(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restarted router read back only the spend of scopes used in the last 40 days: a key that
    had spent its budget and then sent nothing for 41 days got all of it again."""
    policy = faulty(upstream, "")
    first = router_factory(policy, master_key=MASTER, durable_log=True)
    key = small_budget(first, capsys)
    statuses = spend_until_refused(first, key["key"])
    assert statuses.count(200) >= 1
    first.stop()
    age_log(first.db_path, 41)
    again = router_factory(policy, master_key=MASTER, store=f"sqlite:///{first.db_path}")
    resp = ask(again, key["key"], "after-41-days")
    assert resp.status_code == 403, "the key's budget started again from zero after 41 quiet days"
    assert resp.json()["error"]["code"] == "budget_exceeded"


def test_a_key_quiet_for_41_days_keeps_its_spend_in_process(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-process budgets dropped a scope unused for 40 days, and did not look it up again."""
    now = [time.time()]
    state = MemoryState(clock=lambda: now[0])

    def swap(s: Services) -> None:
        s.state = state

    r = router_factory(faulty(upstream, ""), master_key=MASTER, services_hook=swap)
    key = small_budget(r, capsys)
    spend_until_refused(r, key["key"])
    now[0] += 41 * DAY
    assert ask(r, key["key"], "after-41-days").status_code == 403, "the key's budget was forgotten"


def test_a_key_budget_outlives_redis_and_its_idle_time(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redis let a key's counts expire after 40 idle days, and a Redis restored from the log read
    back only the keys used in the last 40 days."""
    r, prefix = redis_router(router_factory, faulty(upstream, ""), master_key=MASTER, durable_log=True)
    key = small_budget(r, capsys)
    spend_until_refused(r, key["key"])
    with redis.Redis(port=REDIS_PORT) as client:
        for name in Keys(prefix).budget(f"key:{key['key_id']}"):
            assert client.pttl(name) in (-1, -2), f"{name} expires: the key's spend would be forgotten"
    # Redis comes back empty 41 days later: the key's spend is read back from the whole log.
    age_log(r.db_path, 41)
    flush_prefix(prefix)
    assert ask(r, key["key"], "after-41-days").status_code == 403, "the key's budget started again from zero"


def test_a_redis_written_before_keys_lasted_is_restored_once(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Redis whose counts an earlier router wrote gave every key's counts a 40-day lifetime, which
    a router that keeps them never touched again unless the key came back: a key quiet since the
    upgrade would still be forgotten. Such a Redis lacks the marker of this layout, so the first
    budget check restores from the log, keeping each key's counts for good."""
    r, prefix = redis_router(router_factory, faulty(upstream, ""), master_key=MASTER, durable_log=True)
    quiet = small_budget(r, capsys)
    spend_until_refused(r, quiet["key"])
    keys = Keys(prefix)
    spent_hash = keys.budget(f"key:{quiet['key_id']}")[0]
    with redis.Redis(port=REDIS_PORT) as client:  # as the earlier router left it
        client.pexpire(spent_hash, int(39 * DAY * 1000))
        client.delete(keys.budget_restored)
        client.set(f"{prefix}budget:restored", "1")
    other = small_budget(r, capsys)
    assert ask(r, other["key"], "another-key").status_code == 200
    with redis.Redis(port=REDIS_PORT) as client:
        assert client.pttl(spent_hash) == -1, "the quiet key's counts still expire"
    assert ask(r, quiet["key"], "still-spent").status_code == 403


def test_a_key_budget_is_not_pushed_out_by_other_tasks(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-process budgets kept a key's scope in the same bounded LRU as tasks': other tasks
    pushed it out, and with it the money its requests in flight held, so a key with room for one
    request admitted a second while the first was still running."""
    state = MemoryState(StateConfig(local_max_entries=4))

    def swap(s: Services) -> None:
        s.state = state

    policy = faulty(upstream, "ttft_ms=2000")
    policy["objective"] = {"max_cost_per_task": 10.0}  # every task has a budget scope
    r = router_factory(policy, master_key=MASTER, services_hook=swap, timeouts=SLOW)
    seen = httpx.post(r.url + "/v1/route", json={"model": "solo", "messages": HI},
                      headers={"x-api-key": MASTER}, timeout=30).json()  # fmt: skip
    hold = seen["candidates"][0].get("hold_usd", seen["candidates"][0]["cost_usd"])
    key = create_key(r, capsys, "--name", "one-at-a-time", "--budget", str(1.5 * hold))
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(ask, r, key["key"], "first")
        time.sleep(0.5)  # admitted: it holds its estimate while its backend thinks
        others = [pool.submit(ask, r, MASTER, f"other-{i}") for i in range(6)]
        time.sleep(0.5)  # the others' tasks admitted too
        second = ask(r, key["key"], "second")
        assert first.result().status_code == 200
        assert all(o.result().status_code == 200 for o in others)
    assert second.status_code == 429, "the key's hold was forgotten: a second request was admitted"
    assert second.json()["error"]["code"] == "budget_held"
