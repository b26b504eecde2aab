"""The PostgreSQL log store: psycopg 3 async on a small connection pool."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from router.store import mask_url, redact, schema
from router.store.records import KeyRecord, OutcomeRecord, RequestRecord, StoreDataError

# Serializes migrations across processes sharing a database (advisory locks are per database).
_MIGRATION_LOCK = zlib.crc32(b"router.store.migrations")
_MAX_LIMIT = 10_000

Pool = AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]


class PostgresStore:
    """The URL may carry a password: it only ever reaches libpq, never a message (see ``mask_url``)."""

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 4, connect_timeout: float = 5.0
    ) -> None:
        self._url = url
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._pool: Pool | None = None
        self._insert_requests = schema.insert_requests_sql("postgres")
        self._upsert_outcome = schema.upsert_outcome_sql("postgres")

    def __repr__(self) -> str:
        return f"PostgresStore({mask_url(self._url)!r})"

    def _db(self) -> Pool:
        if self._pool is None:
            raise RuntimeError(f"{self!r} is not open")
        return self._pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        await self._probe()
        pool: Pool = AsyncConnectionPool(
            self._url,
            min_size=self._min_size,
            max_size=self._max_size,
            open=False,
            kwargs={"connect_timeout": self._libpq_timeout},
            # Validates a pooled connection before use, so a database restart costs no failed write.
            check=AsyncConnectionPool.check_connection,
            timeout=self._connect_timeout + 1.0,
            name="router-log-store",
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout * 2)
            await self._migrate(pool)
            await self._verify(pool)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def _probe(self) -> None:
        # The pool retries quietly until its timeout and then reports only that it timed out; one
        # direct attempt fails fast with libpq's reason (refused, auth, no such database).
        try:
            conn = await psycopg.AsyncConnection.connect(self._url, connect_timeout=self._libpq_timeout)
        except psycopg.Error as exc:
            # libpq quotes a malformed URL, password included, in its message: redact it, and raise
            # outside this block so the original exception is not chained to ours.
            reason = redact(str(exc).strip(), self._url)
        else:
            await conn.close()
            return
        raise ConnectionError(f"cannot connect to PostgreSQL log store {mask_url(self._url)}: {reason}")

    @property
    def _libpq_timeout(self) -> int:
        return max(2, math.ceil(self._connect_timeout))  # libpq wants whole seconds, at least 2

    @staticmethod
    async def _migrate(pool: Pool) -> None:
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(schema.version_table_ddl("postgres"))
            cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            row = await cur.fetchone()
            current = row[0] if row else 0
            for version, stmts in schema.migrations("postgres"):
                if version <= current:
                    continue
                for stmt in stmts:
                    await conn.execute(stmt)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)", (version, time.time())
                )

    async def _verify(self, pool: Pool) -> None:
        async with pool.connection() as conn:
            for table in schema.TABLES:
                cur = await conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = %s",
                    (table.name,),
                )
                missing = schema.missing_columns(table, [r[0] for r in await cur.fetchall()])
                if missing:
                    raise RuntimeError(
                        f"{self!r}: table {table.name} lacks columns {missing}; a record field was added "
                        "without metadata={'since': N}"
                    )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def ping(self) -> bool:
        try:
            async with self._db().connection(timeout=self._connect_timeout) as conn:
                cur = await conn.execute("SELECT 1")
                row = await cur.fetchone()
                return row is not None and row[0] == 1
        except Exception:
            return False

    async def write_requests(self, records: Sequence[RequestRecord]) -> None:
        await self.write_rows([schema.encode_request(r) for r in records])

    async def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            await self._write(self._insert_requests, list(rows))

    async def write_outcome(self, rec: OutcomeRecord) -> None:
        await self._write(self._upsert_outcome, [schema.encode_outcome(rec)])

    async def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            async with self._db().connection() as conn, conn.transaction(), conn.cursor() as cur:
                # executemany runs in pipeline mode: one round trip per batch, not per row.
                await cur.executemany(sql, rows)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise StoreDataError(str(exc)) from exc

    async def _query(self, table: schema.Table, sql: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        async with self._db().connection() as conn:
            cur = await conn.execute(sql, params)
            return [schema.decode_row(table, row) for row in await cur.fetchall()]

    async def get_request(self, request_id: str) -> dict[str, Any] | None:
        sql = schema.select_sql(schema.REQUESTS, "postgres", where="request_id")
        rows = await self._query(schema.REQUESTS, sql, (request_id,))
        return rows[0] if rows else None

    async def recent_requests(self, limit: int = 100) -> list[dict[str, Any]]:
        sql = schema.select_sql(schema.REQUESTS, "postgres", order="ts DESC, request_id DESC", limit=True)
        return await self._query(schema.REQUESTS, sql, (max(0, min(int(limit), _MAX_LIMIT)),))

    async def requests_for_task(self, task_id: str) -> list[dict[str, Any]]:
        sql = schema.select_sql(schema.REQUESTS, "postgres", where="task_id", order="ts, request_id")
        return await self._query(schema.REQUESTS, sql, (task_id,))

    async def outcomes_for_task(self, task_id: str) -> list[dict[str, Any]]:
        sql = schema.select_sql(schema.OUTCOMES, "postgres", where="task_id", order="attempt, source")
        return await self._query(schema.OUTCOMES, sql, (task_id,))

    async def requests_since(self, ts: float) -> list[dict[str, Any]]:
        sql = schema.select_sql(schema.REQUESTS, "postgres", where="ts", op=">=", order="ts, request_id")
        return await self._query(schema.REQUESTS, sql, (ts,))

    async def outcomes_since(self, ts: float) -> list[dict[str, Any]]:
        sql = schema.select_sql(schema.OUTCOMES, "postgres", where="ts", op=">=", order="ts")
        return await self._query(schema.OUTCOMES, sql, (ts,))

    async def spend_by(self, column: str) -> dict[str, float]:
        async with self._db().connection() as conn:
            cur = await conn.execute(schema.spend_sql(column))
            return {str(k): float(v) for k, v in await cur.fetchall()}

    async def spend_of(self, column: str, value: str) -> float:
        async with self._db().connection() as conn:
            cur = await conn.execute(schema.spend_sql(column, "postgres"), (value,))
            row = await cur.fetchone()
        return float(row[1]) if row else 0.0

    async def create_key(self, rec: KeyRecord) -> None:
        await self._write(schema.insert_key_sql("postgres"), [schema.encode_key(rec)])

    async def get_key_by_hash(self, key_hash: str) -> KeyRecord | None:
        sql = schema.select_sql(schema.KEYS, "postgres", where="key_hash")
        async with self._db().connection() as conn:
            cur = await conn.execute(sql, (key_hash,))
            row = await cur.fetchone()
        return schema.decode_key(row) if row is not None else None

    async def list_keys(self) -> list[KeyRecord]:
        sql = schema.select_sql(schema.KEYS, "postgres", order="created_at, key_id")
        async with self._db().connection() as conn:
            cur = await conn.execute(sql)
            return [schema.decode_key(r) for r in await cur.fetchall()]

    async def revoke_key(self, key_id: str, ts: float) -> bool:
        async with self._db().connection() as conn:
            cur = await conn.execute(schema.revoke_key_sql("postgres"), (ts, key_id))
            return cur.rowcount > 0
