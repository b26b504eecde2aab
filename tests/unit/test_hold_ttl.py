"""How long a budget hold lasts unless renewed (``ROUTER_RESERVATION_TTL_S``): running requests
renew theirs (``test_long_holds.py``), so it is how long a crashed replica's holds keep its keys'
and tasks' money from every replica. At 10 minutes, a key with a $0.5 budget, $0.4386 of it held
by the streams of a replica killed mid-stream, was refused (429 ``budget_held``) everywhere for
that long. Holds are made as a crashed replica made them: reserved, and never renewed or settled.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from router.app.cli import main
from router.fakeupstream import FakeUpstream
from router.shared import Reservation
from router.shared.redis_keys import Keys
from tests.unit.inprocess import MASTER, Router, serving
from tests.unit.requestpath import model

REDIS = "redis://127.0.0.1:6379/0"


def stores(slow: bool = False) -> list[Any]:
    """The budgets in this process and in the machine's Redis (``slow``: both wait out a hold)."""
    marks = [pytest.mark.integration]
    return [pytest.param("memory", marks=marks if slow else []), pytest.param("redis", marks=marks)]


def shared(store: str) -> dict[str, Any]:
    if store == "memory":
        return {}
    return {"redis_url": REDIS, "redis_prefix": f"test:{uuid.uuid4().hex[:8]}:", "redis_timeout_s": 2.0}


def flush(r: Router) -> None:
    prefix = r.s.settings.redis_prefix
    if r.s.settings.redis_url is not None:
        with redis.Redis(port=6379) as c:
            keys = list(c.scan_iter(match=prefix + "*", count=1000))
            if keys:
                c.delete(*keys)


async def orphan(r: Router, key_id: str, usd: float) -> Reservation:
    """A hold of the key's, as a replica killed mid-stream left it."""
    return await r.s.state.budgets.reserve([f"key:{key_id}"], usd, {f"key:{key_id}": usd})


def lifetime(r: Router, held: Reservation) -> float:
    """Seconds until the store lets the hold go, as the store itself has it."""
    if r.s.settings.redis_url is None:
        return held.expires_at - time.time()  # the in-process budgets' own expiry, on their clock
    with redis.Redis(port=6379) as c:
        expiry_ms = c.zscore(Keys(r.s.settings.redis_prefix).budget(held.scopes[0])[1], held.id)
        secs, micros = c.time()
    assert expiry_ms is not None
    return expiry_ms / 1000 - (secs + micros / 1e6)


@pytest.mark.parametrize("store", stores())
@pytest.mark.parametrize(("given", "ttl"), [(None, 60.0), ("90", 90.0)], ids=["default", "env"])
async def test_a_crashed_replicas_holds_lapse_in_a_minute_unless_set_otherwise(
    fake: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    given: str | None,
    ttl: float,
) -> None:
    """A hold no one renews is given a minute, or ``ROUTER_RESERVATION_TTL_S``, by the store
    itself: it was given ten minutes (the Redis clock's expiry, or the in-process budgets')."""
    if given is not None:
        monkeypatch.setenv("ROUTER_RESERVATION_TTL_S", given)
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER, **shared(store)) as r:
        try:
            _, key_id = await r.key(budget_usd=0.5)
            held = await orphan(r, key_id, 0.5)
            assert ttl - 2.0 < lifetime(r, held) <= ttl
        finally:
            flush(r)


@pytest.mark.parametrize("store", stores(slow=True))
async def test_holds_no_one_renews_free_the_budget_after_the_ttl_set(
    fake: FakeUpstream, tmp_path: Path, store: str
) -> None:
    """The key a dead replica's hold fills is refused while the hold lives, and served once the
    TTL set has passed (the shortest allowed, 10 s), every replica seeing the same."""
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER, reservation_ttl_s=10,
                       **shared(store)) as r:  # fmt: skip
        try:
            key, key_id = await r.key(budget_usd=0.5)
            await orphan(r, key_id, 0.5)
            made = time.monotonic()
            refused = await r.post(key=key, max_tokens=100)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_held"
            await asyncio.sleep(10.5 - (time.monotonic() - made))
            assert (await r.post(key=key, max_tokens=100)).status_code == 200
        finally:
            flush(r)


@pytest.mark.parametrize("given", ["0", "-60", "9", "3601", "a minute"])
def test_a_hold_ttl_out_of_bounds_is_one_line_naming_it(
    given: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TTL that is not a number, or outside 10 s to an hour, is refused by name before serving."""
    monkeypatch.setenv("ROUTER_RESERVATION_TTL_S", given)
    assert main(["check", "--config", "policies/examples/local.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router check: reservation_ttl_s: ") and "ROUTER_RESERVATION_TTL_S" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
