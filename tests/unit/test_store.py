"""The log store (SQLite), its migrations, URL parsing, the batched writer and the task group."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.background import Background
from router.errors import ConfigError
from router.store import Store, StoreDataError, mask_url, open_store, redact, schema
from router.store.records import Estimate, OutcomeRecord, RequestRecord, TryRecord
from router.store.rows import Decoder
from router.store.sqlite import SQLiteStore
from router.store.writer import LogWriter
from tests.unit.olddb import database_at


def full_record(request_id: str = "req-full") -> RequestRecord:
    """Every field set to a distinctive non-default value."""
    return RequestRecord(
        request_id=request_id,
        ts=1_700_000_000.125,
        decision_id="dec-1",
        task_id="task-1",
        attempt=2,
        side_call=True,
        protocol="anthropic",
        endpoint="/v1/messages",
        client="claude-cli",
        requested_model="claude-sonnet-4",
        chosen_model="cheap-model",
        backend_model="openai/gpt-4o-mini",
        provider_model="gpt-4o-mini-2024-07-18",
        policy="default@3",
        decision_reason="cheapest above quality floor",
        propensity=0.75,
        candidates=[
            Estimate("cheap-model", 1200, 80, 0, 0.0004, p_success=0.8, output_cell="6:8"),
            Estimate("x", 1200, 80, 512, 0.01, excluded="ctx"),
        ],
        tries=[TryRecord("a", 3.5, 12.5, 529, "UpstreamOverloaded"), TryRecord("b", status=200)],
        stream=True,
        status=200,
        error_type="UpstreamError",
        error_message="nul\x00 and ünïcode ✓",
        input_tokens=1234,
        output_tokens=56,
        cache_read_tokens=1000,
        cache_write_tokens=7,
        reasoning_tokens=9,
        usage_estimated=True,
        prompt_tokens_est=1200,
        cost_usd=0.00123,
        cost_est_usd=0.0011,
        queue_ms=0.5,
        ttft_ms=321.0,
        decode_ms=1500.25,
        gap_mean_ms=20.0,
        gap_p95_ms=55.5,
        gap_max_ms=99.0,
        delivery_ms=1.5,
        total_ms=1822.0,
        temperature=0.2,
        top_p=0.9,
        max_tokens=4096,
        reasoning_effort="high",
        thinking_budget=2048,
        tools_sha256="a" * 64,
        system_sha256="b" * 64,
        n_messages=12,
        n_tools=3,
        prompt="hello\nworld",
        p_success=0.625,
    )


def expected_row(rec: RequestRecord) -> RequestRecord:
    """The record as it reads back: a NUL in text is stored as U+FFFD."""
    if isinstance(rec.error_message, str):
        return replace(rec, error_message=rec.error_message.replace("\x00", "\ufffd"))
    return rec


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "sub" / "log.db"))
    await s.open()
    yield s
    await s.close()


# --- schema -----------------------------------------------------------------------------------


def test_columns_follow_the_records() -> None:
    assert schema.REQUESTS.names == RequestRecord.columns()
    assert schema.OUTCOMES.names == OutcomeRecord.columns()
    kinds = {c.name: c.kind for c in schema.REQUESTS.columns}
    assert kinds["candidates"] == kinds["tries"] == "json"
    assert kinds["stream"] == kinds["side_call"] == kinds["usage_estimated"] == "bool"
    assert kinds["input_tokens"] == "int" and kinds["ttft_ms"] == "float" and kinds["prompt"] == "text"
    assert RequestRecord.columns() == tuple(
        [
            "request_id",
            "ts",
            "decision_id",
            "task_id",
            "attempt",
            "side_call",
            "protocol",
            "endpoint",
            "client",
            "requested_model",
            "chosen_model",
            "backend_model",
            "provider_model",
            "response_id",
            "finish_reasons",
            "policy",
            "decision_reason",
            "propensity",
            "candidates",
            "tries",
            "stream",
            "status",
            "error_type",
            "error_message",
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
            "reasoning_tokens",
            "usage_estimated",
            "prompt_tokens_est",
            "cost_usd",
            "cost_est_usd",
            "cost_input_usd",
            "cost_output_usd",
            "cost_cache_read_usd",
            "cost_cache_write_usd",
            "queue_ms",
            "retry_ms",
            "ttft_ms",
            "decode_ms",
            "gap_mean_ms",
            "gap_p95_ms",
            "gap_max_ms",
            "delivery_ms",
            "total_ms",
            "temperature",
            "top_p",
            "max_tokens",
            "reasoning_effort",
            "thinking_budget",
            "tools_sha256",
            "system_sha256",
            "n_messages",
            "n_tools",
            "prompt",
            "task_features",
            "key_id",
            "policy_revision",
            "arm",
            "rule_headers",
            "repo",
            "p_success",
            "cost_tools_usd",
        ]
    )


def test_both_dialects_share_one_spec() -> None:
    lite, pg = schema.migrations("sqlite"), schema.migrations("postgres")
    assert [v for v, _ in lite] == [v for v, _ in pg] == list(range(1, schema.SCHEMA_VERSION + 1))
    create_lite = lite[0][1][0]
    create_pg = pg[0][1][0]
    assert "propensity REAL" in create_lite and "propensity DOUBLE PRECISION" in create_pg
    assert create_lite.count(",") == create_pg.count(",")


# --- SQLite store -----------------------------------------------------------------------------


async def test_open_creates_file_and_records_version(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "log.db"
    s = SQLiteStore(str(path))
    await s.open()
    assert await s.ping()
    await s.close()
    assert not await s.ping()
    with sqlite3.connect(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version")]
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert versions == list(range(1, schema.SCHEMA_VERSION + 1))
    assert mode == "wal"
    assert {"requests_task_id_idx", "requests_ts_idx"} <= indexes
    assert "requests_chosen_model_ts_idx" not in indexes  # dropped by version 4


def file_modes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}


async def test_a_new_log_is_readable_by_its_owner_alone(tmp_path: Path) -> None:
    """With the usual umask (022) the log and its WAL were readable by every user of the machine:
    tasks, keys' ids and spend, and the prompts of an operator who opted in to keeping them."""
    path = tmp_path / "log.db"
    s = SQLiteStore(str(path))
    await s.open()
    await s.write_requests([RequestRecord("r1", 1.0, prompt="a prompt")])
    modes = file_modes(tmp_path)
    await s.close()
    assert "log.db-wal" in modes and set(modes.values()) == {0o600}, modes


async def test_version_4_drops_the_unused_backend_index(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with contextlib.closing(database_at(path, 3)) as conn, conn:
        conn.execute("CREATE INDEX requests_chosen_model_ts_idx ON requests (chosen_model, ts)")
    s = SQLiteStore(str(path))
    await s.open()
    await s.close()
    with sqlite3.connect(path) as conn:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "requests_chosen_model_ts_idx" not in indexes and "requests_ts_idx" in indexes


async def test_version_9_adds_the_stop_loss_reading_to_a_version_8_log(tmp_path: Path) -> None:
    path = tmp_path / "v8.db"
    with contextlib.closing(database_at(path, 8)) as conn, conn:
        conn.execute("INSERT INTO requests (request_id, ts) VALUES ('old', 1.0)")
        assert "p_success" not in {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
    s = SQLiteStore(str(path))
    await s.open()
    try:
        old = await stored(s, "old")
        assert old is not None and old.p_success is None  # logged before the reading was
        await s.write_requests([full_record()])
        new = await stored(s, "req-full")
        assert new is not None and new.p_success == 0.625
    finally:
        await s.close()


async def test_migrations_are_idempotent(tmp_path: Path) -> None:
    path = str(tmp_path / "log.db")
    first = SQLiteStore(path)
    await first.open()
    await first.write_requests([full_record()])
    await first.close()
    second = SQLiteStore(path)
    await second.open()
    assert await stored(second, "req-full") == expected_row(full_record())
    await second.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == schema.SCHEMA_VERSION


async def test_concurrent_opens_migrate_once(tmp_path: Path) -> None:
    path = str(tmp_path / "log.db")
    stores = [SQLiteStore(path) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(s.close() for s in stores))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == schema.SCHEMA_VERSION


async def test_opening_waits_for_another_process_writing_the_file_before_switching_it_to_wal(
    tmp_path: Path,
) -> None:
    # Another opener's migration holds the write lock while this one switches the journal: SQLite
    # answers "database is locked" at once there (the flake of test_concurrent_opens_migrate_once).
    path = str(tmp_path / "log.db")
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("CREATE TABLE other (x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO other VALUES (1)")
        holding.set()
        release.wait(10)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(10)
    threading.Timer(0.3, release.set).start()
    store = SQLiteStore(path)
    try:
        await store.open()
    finally:
        release.set()
        thread.join()
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def stored(store: Store, request_id: str) -> RequestRecord | None:
    """One request's logged row, read as the log's readers read it."""
    return next((r for r in await store.requests_since(0.0) if r.request_id == request_id), None)


async def check_round_trip(store: Store) -> None:
    """Shared with the PostgreSQL integration test: every field, then an all-defaults record."""
    rec = full_record()
    await store.write_requests([rec])
    got = await stored(store, rec.request_id)
    assert got == expected_row(rec)
    assert got is not None
    assert got.stream is True and got.side_call is True and got.usage_estimated is True
    assert isinstance(got.ttft_ms, float) and isinstance(got.input_tokens, int)
    minimal = RequestRecord(request_id="req-min", ts=5.0)
    await store.write_requests([minimal])
    got = await stored(store, "req-min")
    assert got == expected_row(minimal)
    assert got is not None
    assert got.candidates is None and got.stream is False and got.status is None
    assert await stored(store, "nope") is None


async def test_round_trip(store: SQLiteStore) -> None:
    await check_round_trip(store)


async def check_batch_and_queries(store: Store) -> None:
    recs = [
        RequestRecord(request_id=f"r{i:03d}", ts=1000.0 + i, task_id="t-even" if i % 2 == 0 else "t-odd",
                      key_id="k1" if i < 4 else None, cost_usd=0.5 if i < 4 else None)
        for i in range(300)
    ]  # fmt: skip
    await store.write_requests(recs)
    await store.write_requests(recs[:10])  # a retried batch: already-stored ids are skipped
    assert [r.request_id for r in await store.requests_since(1295.0)] == [f"r{i}" for i in range(295, 300)]
    assert len(await store.requests_since(0.0)) == 300
    latest = await store.requests_since(1100.0, limit=3)  # the latest three, oldest first
    assert [r.request_id for r in latest] == ["r297", "r298", "r299"]
    assert len(await store.requests_since(1297.0, limit=10)) == 3
    even = await store.requests_for_task("t-even")
    assert [r.request_id for r in even] == [f"r{i:03d}" for i in range(0, 300, 2)]
    # What in-process budgets restart from: the retried batch is not counted twice.
    assert await store.spend_by("key_id", 0.0) == {"k1": 2.0}
    assert await store.spend_by("task_id", 0.0) == {"t-even": 1.0, "t-odd": 1.0}
    assert (
        await store.spend_of("key_id", "k1", 0.0) == 2.0
        and await store.spend_of("task_id", "nobody", 0.0) == 0.0
    )
    # Only scopes used since: k1's last request is at 1003, t-even's at 1298 (one with no cost
    # counts as use: a refused request touches its scopes), t-odd's at 1299.
    assert (
        await store.spend_by("key_id", 1003.0) == {"k1": 2.0} and await store.spend_by("key_id", 1003.5) == {}
    )
    assert await store.spend_by("task_id", 1298.5) == {"t-odd": 1.0}
    assert await store.spend_of("key_id", "k1", 1003.5) == 0.0
    assert await store.spend_of("task_id", "t-even", 1298.0) == 1.0


async def test_batch_write_and_queries(store: SQLiteStore) -> None:
    await check_batch_and_queries(store)


def outcome(
    attempt: int | None, success: bool, source: str, score: float | None = None, details: Any = None
) -> OutcomeRecord:
    return OutcomeRecord(
        task_id="t1",
        attempt=attempt,
        success=success,
        score=score,
        source=source,
        details=details,
        ts=10.0,
        explicit=source == "explicit",
    )


async def check_outcome_upsert(store: Store) -> None:
    await store.write_outcome(outcome(None, False, "explicit"))
    await store.write_outcome(outcome(None, True, "explicit", 0.9, {"note": "fixed"}))
    await store.write_outcome(outcome(1, False, "retry"))
    await store.write_outcome(outcome(1, False, "retry"))
    rows = await store.outcomes_for_task("t1")
    # An unknown attempt is stored, and read back, as 0 (it is part of the primary key).
    assert rows == [
        OutcomeRecord("t1", 0, True, 0.9, "explicit", {"note": "fixed"}, 10.0, True),
        OutcomeRecord("t1", 1, False, None, "retry", None, 10.0, False),
    ]


async def test_outcome_upsert_is_idempotent_per_key(store: SQLiteStore) -> None:
    await check_outcome_upsert(store)


async def test_a_batch_goes_in_whole_and_in_order_whatever_its_size(store: SQLiteStore) -> None:
    # 64 + 8 + 1 + 1 rows: each of SQLite's multi-row statements, and the rest one by one.
    n = 74
    await store.write_requests(
        [RequestRecord(request_id=f"r{i:03}", ts=float(i), task_id="t") for i in range(n)]
    )
    assert [r.request_id for r in await store.requests_for_task("t")] == [f"r{i:03}" for i in range(n)]
    # One batch holding a key many times: the last row of it is what stays, as one by one.
    rows = [schema.encode_outcome(outcome(1, i % 2 == 0, "label", score=i / 100)) for i in range(n)]
    await store.write_outcome_rows(rows)
    assert [(o.success, o.score) for o in await store.outcomes_for_task("t1")] == [(False, 0.73)]


async def check_bad_record_rolls_back(store: Store) -> None:
    bad = RequestRecord(request_id="bad", ts=1.0, input_tokens=2**70)
    with pytest.raises(StoreDataError, match="input_tokens"):
        await store.write_requests([RequestRecord(request_id="good", ts=1.0), bad])
    assert await stored(store, "good") is None  # all or nothing per batch


async def test_unencodable_record_raises_store_data_error(store: SQLiteStore) -> None:
    await check_bad_record_rolls_back(store)


async def test_store_refuses_calls_before_open(tmp_path: Path) -> None:
    s = SQLiteStore(str(tmp_path / "x.db"))
    with pytest.raises(RuntimeError, match="not open"):
        await s.write_requests([RequestRecord(request_id="r", ts=1.0)])
    assert not await s.ping()


def test_the_json_columns_of_records_keep_their_stored_form() -> None:
    rec = full_record()
    row = dict(zip(schema.REQUESTS.names, schema.encode_request(rec), strict=True))
    # A candidate leaves out its None fields (as /v1/route shows it); a try writes them as null.
    assert orjson.loads(row["candidates"])[1] == {
        "model": "x", "prompt_tokens": 1200, "output_tokens": 80, "cached_tokens": 512, "cost_usd": 0.01,
        "excluded": "ctx",
    }  # fmt: skip
    assert row["tries"].endswith('{"model":"b","start_ms":null,"ms":null,"status":200,"error_type":null}]')
    # What another version wrote reads back: keys the record lacks are ignored; an item without a
    # key it needs, or not an object, is left out; a column that is not a list reads as None.
    other = orjson.dumps([
        {"model": "a", "prompt_tokens": 1, "output_tokens": 2, "cached_tokens": 0, "cost_usd": 0.5, "gone": 1},
        {"model": "b"}, 3,
    ]).decode()  # fmt: skip
    names = ("request_id", "ts", "candidates", "tries")
    got = Decoder(schema.REQUESTS, RequestRecord, names).one(("r", 1.0, other, '{"model": "a"}'))
    assert got.candidates == [Estimate("a", 1, 2, 0, 0.5)] and got.tries is None


async def test_a_read_may_leave_out_columns(store: SQLiteStore) -> None:
    rec = full_record()
    await store.write_requests([rec])
    (got,) = await store.requests_since(0.0, without=("prompt", "candidates"))
    assert got.prompt is None and got.candidates is None
    assert replace(got, prompt=rec.prompt, candidates=rec.candidates) == expected_row(rec)
    with pytest.raises(ValueError, match="request_id"):
        await store.requests_since(0.0, without=("request_id",))


def test_a_row_of_some_columns_reads_back_with_the_others_at_their_defaults() -> None:
    names = ("ts", "request_id", "stream", "candidates", "cost_usd", "attempt")
    row = (
        1.0,
        "r",
        1,
        '[{"model": "a", "prompt_tokens": 9, "output_tokens": 1, "cached_tokens": 0, "cost_usd": 0}]',
        2,
        3,
    )
    got = Decoder(schema.REQUESTS, RequestRecord, names).one(row)
    # SQLite's dynamic typing can hand back an integer from a REAL column: still a float.
    assert got == RequestRecord(
        "r", 1.0, stream=True, candidates=[Estimate("a", 9, 1, 0, 0)], cost_usd=2.0, attempt=3
    )
    assert isinstance(got.cost_usd, float)
    with pytest.raises(ValueError, match="request_id"):
        Decoder(schema.REQUESTS, RequestRecord, ("ts", "stream"))
    with pytest.raises(ValueError, match="no columns"):
        Decoder(schema.REQUESTS, RequestRecord, ("request_id", "ts", "nope"))


async def test_memory_store() -> None:
    s = open_store("sqlite:///:memory:")
    await s.open()
    await s.write_requests([RequestRecord(request_id="m", ts=1.0)])
    got = await stored(s, "m")
    assert got is not None and got.ts == 1.0
    await s.close()


# --- open_store / URLs ------------------------------------------------------------------------


def test_open_store_sqlite_paths() -> None:
    rel = open_store("sqlite:///relative/path.db")
    absolute = open_store("sqlite:////abs/path.db")
    assert isinstance(rel, SQLiteStore) and repr(rel) == "SQLiteStore('relative/path.db')"
    assert isinstance(absolute, SQLiteStore) and repr(absolute) == "SQLiteStore('/abs/path.db')"


def test_open_store_postgres_masks_password() -> None:
    s = open_store("postgresql://router:s3cret@db.internal:5432/logs")
    assert type(s).__name__ == "PostgresStore"
    assert "s3cret" not in repr(s) and "router:***@db.internal" in repr(s)
    assert type(open_store("postgres://h/db")).__name__ == "PostgresStore"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://admin:hunter2@db/logs",
        "sqlite://host/x.db",
        "sqlite:///",
        "just-a-path.db",
        "redis://:hunter2@h",
    ],
)
def test_open_store_rejects_bad_urls_without_leaking_passwords(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)
    message = str(info.value)
    assert "hunter2" not in message
    assert mask_url(url) in message


def test_redact_removes_the_password_anywhere() -> None:
    url = "postgresql://u:p%40ss@h/db"
    assert redact('bad token "p%40ss" and "p@ss" in postgresql://u:p%40ss@h/db', url) == (
        'bad token "***" and "***" in postgresql://u:***@h/db'
    )
    assert redact("password=pw is wrong", "host=h password=pw") == "password=*** is wrong"
    assert redact("nothing secret", "postgresql://h/db") == "nothing secret"


def test_redact_removes_what_a_driver_quotes_of_a_password_with_an_unescaped_at() -> None:
    """psycopg ends the password at its first "@" and quotes the rest as the host it could not
    resolve: `router keys list --store postgresql://u:SEC@RETPW99@127.0.0.1:1/test` printed
    "failed to resolve host 'RETPW99@127.0.0.1'"."""
    url = "postgresql://u:SEC@RETPW99@127.0.0.1:1/test"
    said = redact("failed to resolve host 'RETPW99@127.0.0.1': Name or service not known", url)
    assert "RETPW99" not in said
    assert said == "failed to resolve host '***@127.0.0.1': Name or service not known"
    assert redact("port 5432 failed", "postgresql://u:p@ss@h/db") == "port 5432 failed"


def test_mask_url() -> None:
    assert (
        mask_url("postgresql://u:p%40ss@h:5432/db?sslmode=require")
        == "postgresql://u:***@h:5432/db?sslmode=require"
    )
    assert mask_url("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    assert mask_url("postgresql://h/db?user=u&password=pw&x=1") == "postgresql://h/db?user=u&password=***&x=1"
    assert mask_url("postgresql://u@h:5432/db") == "postgresql://u@h:5432/db"
    assert mask_url("host=h password=pw dbname=d") == "host=h password=*** dbname=d"


# --- writer -----------------------------------------------------------------------------------


class FakeStore:
    """Records what was written; fails the first ``fail_times`` writes; refuses ids in ``poison``."""

    def __init__(self, fail_times: int = 0, poison: frozenset[str] = frozenset()) -> None:
        self.fail_times = fail_times
        self.poison = poison
        self.calls = 0
        self.batches: list[list[str]] = []
        self.label_batches: list[list[tuple[Any, ...]]] = []

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ping(self) -> bool:
        return True

    async def write_requests(self, records: Sequence[RequestRecord]) -> None:
        await self.write_rows([schema.encode_request(r) for r in records])

    async def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise ConnectionError("database is down")
        ids = [schema.request_id_of(r) for r in rows]
        if any(i in self.poison for i in ids):
            raise StoreDataError("bad row")
        self.batches.append(ids)

    async def write_outcome(self, rec: OutcomeRecord) -> None:
        await self.write_outcome_rows([schema.encode_outcome(rec)])

    async def write_outcome_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise ConnectionError("database is down")
        self.label_batches.append([(r[0], r[1], r[3]) for r in rows])  # task, attempt, score

    async def requests_for_task(self, task_id: str, limit: int | None = None) -> list[RequestRecord]:
        return []

    async def outcomes_for_task(self, task_id: str) -> list[OutcomeRecord]:
        return []

    @property
    def ids(self) -> list[str]:
        return [i for b in self.batches for i in b]


def recs(n: int, prefix: str = "r") -> list[RequestRecord]:
    return [RequestRecord(request_id=f"{prefix}{i}", ts=float(i)) for i in range(n)]


async def until(cond: Any, seconds: float = 2.0) -> None:
    async with asyncio.timeout(seconds):
        while not cond():  # noqa: ASYNC110 - polling plain counters; there is no event to wait on
            await asyncio.sleep(0.005)


def test_fake_store_satisfies_protocol() -> None:
    store: Store = FakeStore()  # mypy checks the structure
    assert store is not None


class HungStore(FakeStore):
    """A store whose ping never answers (a database that accepts the connection and stalls)."""

    async def ping(self) -> bool:
        await asyncio.Event().wait()
        return True


async def test_the_store_answers_or_not_within_the_bound() -> None:
    assert await LogWriter(FakeStore()).store_answers(within=1.0)
    async with asyncio.timeout(2.0):  # bounded by ``within``, not by the hung ping
        assert not await LogWriter(HungStore()).store_answers(within=0.05)


async def test_writer_batches_by_size() -> None:
    fake = FakeStore()
    w = LogWriter(fake, batch_size=4, flush_interval=60)
    for r in recs(10):
        w.submit(r)
    assert fake.calls == 0  # submit never writes
    await w.flush()
    assert fake.batches == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"], ["r8", "r9"]]
    assert (w.written, w.buffered, w.dropped) == (10, 0, 0)


async def test_writer_loop_wakes_when_a_batch_is_full() -> None:
    fake, tasks = FakeStore(), Background()
    w = LogWriter(fake, batch_size=3, flush_interval=60)
    w.start(tasks)
    for r in recs(3):
        w.submit(r)
    await until(lambda: w.written == 3)
    assert fake.batches == [["r0", "r1", "r2"]]
    await w.close(timeout=1)
    await tasks.drain(timeout=1)


async def test_writer_flushes_at_close() -> None:
    fake, tasks = FakeStore(), Background()
    w = LogWriter(fake, batch_size=100, flush_interval=60)
    w.start(tasks)
    await asyncio.sleep(0)  # the loop runs up to its wait for the next interval (idle, as in production)
    for r in recs(7):
        w.submit(r)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await w.close(timeout=2)
    assert loop.time() - started < 0.5  # close wakes the loop instead of waiting out the interval
    assert fake.ids == [f"r{i}" for i in range(7)]
    assert w.written == 7 and len(tasks) == 0
    w.submit(RequestRecord(request_id="late", ts=1.0))
    assert w.dropped == 1 and w.buffered == 0


async def test_writer_retries_after_store_failures() -> None:
    fake, tasks = FakeStore(fail_times=2), Background()
    w = LogWriter(fake, batch_size=2, flush_interval=0.01, retry_base=0.01, retry_cap=0.05)
    w.start(tasks)
    for r in recs(5):
        w.submit(r)
    await until(lambda: w.written == 5)
    assert fake.ids == ["r0", "r1", "r2", "r3", "r4"]  # in order, each once
    assert w.failures == 2 and w.dropped == 0 and w.buffered == 0
    await w.close(timeout=1)


async def test_flush_raises_and_keeps_records_when_store_fails() -> None:
    fake = FakeStore(fail_times=1)
    w = LogWriter(fake, batch_size=10, flush_interval=60)
    for r in recs(3):
        w.submit(r)
    with pytest.raises(ConnectionError):
        await w.flush()
    assert w.buffered == 3 and w.failures == 1
    await w.flush()
    assert fake.ids == ["r0", "r1", "r2"] and w.buffered == 0


async def test_overflow_drops_oldest_and_counts() -> None:
    fake = FakeStore()
    w = LogWriter(fake, batch_size=100, flush_interval=60, max_buffer=5)
    for r in recs(8):
        w.submit(r)
    assert w.dropped == 3 and w.buffered == 5
    await w.flush()
    assert fake.ids == ["r3", "r4", "r5", "r6", "r7"]


async def test_close_gives_up_at_timeout_and_counts_losses() -> None:
    fake, tasks = FakeStore(fail_times=10**9), Background()
    w = LogWriter(fake, batch_size=2, flush_interval=0.01, retry_base=0.01, retry_cap=0.02)
    w.start(tasks)
    for r in recs(5):
        w.submit(r)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await w.close(timeout=0.2)
    assert 0.15 < loop.time() - started < 1.0
    assert w.dropped == 5 and w.buffered == 0 and w.written == 0 and w.failures >= 2
    await tasks.drain(timeout=1)
    assert len(tasks) == 0


async def test_bad_records_are_isolated_and_rejected() -> None:
    fake = FakeStore(poison=frozenset({"r2", "r5"}))
    w = LogWriter(fake, batch_size=8, flush_interval=60)
    for r in recs(8):
        w.submit(r)
    await w.flush()
    assert sorted(fake.ids) == ["r0", "r1", "r3", "r4", "r6", "r7"]
    assert (w.written, w.rejected, w.failures, w.buffered) == (6, 2, 0, 0)


async def test_writer_with_real_sqlite_rejects_only_the_bad_record(store: SQLiteStore) -> None:
    w = LogWriter(store, batch_size=4, flush_interval=60)
    batch = recs(4)
    batch[1].input_tokens = 2**64
    for r in batch:
        w.submit(r)
    await w.flush()
    assert w.written == 3 and w.rejected == 1
    assert sorted(r.request_id for r in await store.requests_since(0.0)) == ["r0", "r2", "r3"]


async def test_a_record_that_cannot_be_encoded_is_rejected_at_submit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeStore()
    w = LogWriter(fake, batch_size=10, flush_interval=60)
    bad = RequestRecord(request_id="huge", ts=1.0, output_tokens=2**70)
    w.submit(bad)  # never raises into the request that ended
    w.submit(RequestRecord(request_id="fine", ts=2.0))
    assert (w.rejected, w.buffered) == (1, 1)
    assert "huge" in caplog.text and "output_tokens" in caplog.text
    await w.flush()
    assert fake.ids == ["fine"]


def label(task: str, attempt: int, score: float) -> OutcomeRecord:
    return OutcomeRecord(task_id=task, attempt=attempt, success=score >= 0.5, score=score,
                         source="label-model", details={"p": score}, ts=score, explicit=False)  # fmt: skip


async def test_labels_are_written_in_one_batch_the_latest_per_attempt(store: SQLiteStore) -> None:
    w = LogWriter(store, batch_size=100, flush_interval=60)
    for rec in (label("t1", 1, 0.2), label("t2", 1, 0.4), label("t1", 1, 0.3), label("t1", 2, 0.6)):
        w.submit_label(rec)
    assert w.buffered == 3  # t1's first label of attempt 1 was replaced before it was stored
    w.submit(RequestRecord(request_id="r0", ts=1.0))
    await w.flush()
    assert (w.written, w.labels_written, w.buffered) == (1, 3, 0)
    t1 = await store.outcomes_for_task("t1")
    assert [(o.attempt, o.score, o.details) for o in t1] == [
        (1, 0.3, {"p": 0.3}),
        (2, 0.6, {"p": 0.6}),
    ]
    assert [o.score for o in await store.outcomes_for_task("t2")] == [0.4]
    w.submit_label(label("t1", 1, 0.9))  # a later turn of the attempt: the stored row is replaced
    await w.flush()
    assert [o.score for o in await store.outcomes_for_task("t1")] == [0.9, 0.6]


async def test_labels_kept_through_a_failing_store_yield_to_newer_ones() -> None:
    fake = FakeStore(fail_times=1)
    w = LogWriter(fake, batch_size=100, flush_interval=60)
    w.submit_label(label("t1", 1, 0.2))
    w.submit_label(label("t2", 1, 0.4))
    with pytest.raises(ConnectionError):
        await w.flush()
    assert w.buffered == 2 and w.failures == 1
    w.submit_label(label("t1", 1, 0.3))  # newer than the one that failed to be stored
    await w.flush()
    assert [sorted(b) for b in fake.label_batches] == [[("t1", 1, 0.3), ("t2", 1, 0.4)]] and w.buffered == 0


async def test_a_label_the_store_refuses_costs_only_itself(store: SQLiteStore) -> None:
    w = LogWriter(store, batch_size=100, flush_interval=60)
    w.submit_label(label("t1", 1, 0.2))
    w.submit_label(label("t2", 2**63, 0.4))  # encodes, but no SQLite integer holds it
    w.submit_label(label("t3", 1, 0.6))
    await w.flush()
    assert (w.labels_written, w.rejected, w.buffered) == (2, 1, 0)
    assert [o.task_id for o in await store.outcomes_since(0.0)] == ["t1", "t3"]


async def test_labels_are_stored_by_the_loop_and_at_close() -> None:
    fake, tasks = FakeStore(), Background()
    w = LogWriter(fake, batch_size=2, flush_interval=0.05)
    w.start(tasks)
    w.submit_label(label("t1", 1, 0.2))
    w.submit_label(label("t2", 1, 0.4))
    await until(lambda: w.labels_written == 2)
    w.submit_label(label("t3", 1, 0.6))
    await w.close(timeout=1)
    assert fake.label_batches == [[("t1", 1, 0.2), ("t2", 1, 0.4)], [("t3", 1, 0.6)]]
    w.submit_label(label("t4", 1, 0.8))
    assert w.dropped == 1 and w.buffered == 0
    await tasks.drain(timeout=1)


def test_writer_validates_settings() -> None:
    with pytest.raises(ValueError):
        LogWriter(FakeStore(), batch_size=0)


# --- background tasks -------------------------------------------------------------------------


async def test_background_tasks_log_failures_and_forget_finished(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Background()

    async def boom() -> None:
        raise ValueError("kaput")

    async def fine() -> int:
        return 7

    caplog.set_level(logging.ERROR, logger="router.background")
    failing = tasks.spawn(boom(), name="boom-task")
    ok = tasks.spawn(fine(), name="fine-task")
    assert len(tasks) == 2
    await tasks.drain(timeout=1)
    assert len(tasks) == 0 and ok.result() == 7 and failing.done()
    assert any("boom-task" in r.getMessage() and r.exc_info for r in caplog.records)
    assert not any("fine-task" in r.getMessage() for r in caplog.records)


async def test_drain_waits_then_cancels_leftovers() -> None:
    tasks = Background()
    cleaned: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0.02)
        tasks.spawn(asyncio.sleep(0.01), name="spawned-while-draining")

    async def stuck() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append("stuck")

    q = tasks.spawn(quick(), name="quick")
    s = tasks.spawn(stuck(), name="stuck")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await tasks.drain(timeout=0.2)
    assert loop.time() - started < 1.0
    assert q.done() and not q.cancelled()
    assert s.cancelled() and cleaned == ["stuck"]
    assert len(tasks) == 0


async def test_a_backlog_larger_than_the_space_freed_drains_as_far_as_it_fits(tmp_path: Path) -> None:
    """Issue 30: after a full disk, space for fewer rows than one batch was never used: the same
    256-row batch failed again and again, and the whole backlog stayed buffered."""
    store = SQLiteStore(str(tmp_path / "log.db"))
    await store.open()
    try:
        db = store._db()  # SQLite's page cap on the store's own connection plays a full disk
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")
        w = LogWriter(store, batch_size=256, flush_interval=60)
        for i in range(600):
            w.submit(RequestRecord(request_id=f"r{i}", ts=float(i), decision_reason="x" * 200))
        with pytest.raises(sqlite3.OperationalError, match="full"):
            await w.flush()
        db.execute(f"PRAGMA max_page_count = {pages + 16}")  # room for about a hundred rows
        for _ in range(12):
            with contextlib.suppress(sqlite3.OperationalError):
                await w.flush()
        stored = len(await store.requests_since(0.0))
        assert 0 < stored < 256 and w.written == stored and w.buffered == 600 - stored
        assert [r.request_id for r in await store.requests_since(0.0)] == [f"r{i}" for i in range(stored)]
    finally:
        await store.close()
