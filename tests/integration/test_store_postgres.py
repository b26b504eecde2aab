"""The PostgreSQL log store against the machine's real server, each test in a throwaway schema.

The server is ``ROUTER_TEST_PG_URL`` (default ``postgresql://root@127.0.0.1:5432/test``). It is part
of this machine kind, so an unreachable server fails the tests rather than skipping them.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from router.store import open_store, schema
from router.store.postgres import PostgresStore
from router.store.records import RequestRecord
from router.store.writer import LogWriter
from tests.unit.test_store import (
    check_bad_record_rolls_back,
    check_batch_and_queries,
    check_outcome_upsert,
    check_round_trip,
    expected_row,
    full_record,
    stored,
)

pytestmark = pytest.mark.integration

BASE_URL = os.environ.get("ROUTER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")


def with_search_path(url: str, schema_name: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema_name}"


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """A URL whose connections see only a fresh schema, dropped afterwards."""
    name = f"router_test_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(BASE_URL, autocommit=True, connect_timeout=5) as admin:
        await admin.execute(f"CREATE SCHEMA {name}")
        try:
            yield with_search_path(BASE_URL, name)
        finally:
            await admin.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.open()
    yield s
    await s.close()


async def test_open_store_url_and_ping(pg_url: str) -> None:
    s = open_store(pg_url)
    assert isinstance(s, PostgresStore)
    await s.open()
    try:
        assert await s.ping()
    finally:
        await s.close()
    assert not await s.ping()


async def test_migrations_are_idempotent(pg_url: str) -> None:
    first = PostgresStore(pg_url)
    await first.open()
    await first.write_requests([full_record()])
    await first.close()
    second = PostgresStore(pg_url)
    await second.open()
    try:
        assert await stored(second, "req-full") == expected_row(full_record())
    finally:
        await second.close()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute("SELECT version FROM schema_version ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == list(range(1, schema.SCHEMA_VERSION + 1))
        cur = await conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        indexes = {r[0] for r in await cur.fetchall()}
    assert {"requests_task_id_idx", "requests_ts_idx"} <= indexes
    assert "requests_chosen_model_ts_idx" not in indexes  # dropped by version 4


async def test_concurrent_opens_migrate_once(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(s.close() for s in stores))
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute("SELECT COUNT(*) FROM schema_version")
        assert await cur.fetchone() == (schema.SCHEMA_VERSION,)


async def test_round_trip(store: PostgresStore) -> None:
    await check_round_trip(store)


async def test_batch_write_and_queries(store: PostgresStore) -> None:
    await check_batch_and_queries(store)


async def test_outcome_upsert(store: PostgresStore) -> None:
    await check_outcome_upsert(store)


async def test_bad_record_rolls_back(store: PostgresStore) -> None:
    await check_bad_record_rolls_back(store)


async def test_writer_end_to_end(store: PostgresStore) -> None:
    w = LogWriter(store, batch_size=50, flush_interval=60)
    for i in range(120):
        w.submit(RequestRecord(request_id=f"w{i:03d}", ts=float(i), task_id="wt", prompt="x\x00y"))
    w.submit(RequestRecord(request_id="poison", ts=500.0, max_tokens=2**63))
    await w.close(timeout=5)
    assert (w.written, w.rejected, w.dropped) == (120, 1, 0)
    rows = await store.requests_for_task("wt")
    assert [r.request_id for r in rows] == [f"w{i:03d}" for i in range(120)]
    assert rows[0].prompt == "x\ufffdy"


async def test_unreachable_server_fails_open_quickly() -> None:
    s = PostgresStore("postgresql://root:topsecret@127.0.0.1:1/none", connect_timeout=2)
    with pytest.raises(ConnectionError, match=r"root:\*\*\*@127\.0\.0\.1:1/none") as info:
        await s.open()
    assert "topsecret" not in str(info.value)
    assert not await s.ping()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pwSECRET@[bad/db",  # libpq quotes the whole URI in this error
        "postgres://u:pw%SECRET@127.0.0.1/db",  # ... and the bad token in this one
        "postgresql://u:pwSECRET@127.0.0.1:badport/db",
    ],
)
async def test_malformed_urls_do_not_leak_the_password(url: str) -> None:
    with pytest.raises(ConnectionError) as info:
        await open_store(url).open()
    assert "SECRET" not in str(info.value)
    assert info.value.__context__ is None and info.value.__cause__ is None


async def test_prune_keeps_the_spend_per_key_and_task(store: PostgresStore) -> None:
    """``router prune`` on PostgreSQL: old rows go, their spend stays (folded again by a later prune)."""
    import time

    now = time.time()
    await store.write_requests([RequestRecord(request_id=f"r{i}", ts=now - 100 + i, key_id="k1",
                                              task_id=f"k1/t{i % 2}", cost_usd=0.5) for i in range(6)])  # fmt: skip
    spend = (await store.spend_by("key_id", 0), await store.spend_by("task_id", 0))
    assert await store.prune(now - 97) == 3
    assert await store.prune(now) == 3
    assert (await store.spend_by("key_id", 0), await store.spend_by("task_id", 0)) == spend
    assert {r.endpoint for r in await store.requests_since(0)} == {schema.PRUNED}
