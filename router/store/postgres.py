"""The PostgreSQL log store: psycopg 3 async on a small connection pool."""

from __future__ import annotations

import math
import time
import zlib
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from router.store import schema
from router.store.records import StoreDataError
from router.store.sql import SQLStore
from router.store.urls import mask_url, redact

# Serializes migrations across processes sharing a database (advisory locks are per database).
_MIGRATION_LOCK = zlib.crc32(b"router.store.migrations")

Pool = AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]


class PostgresStore(SQLStore):
    """The URL may carry a password: it only ever reaches libpq, never a message (see ``mask_url``)."""

    dialect = "postgres"

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 4, connect_timeout: float = 5.0
    ) -> None:
        super().__init__()
        self._url = url
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._pool: Pool | None = None

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

    async def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        await self._transaction([(sql, rows)])

    async def _transaction(self, steps: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        try:
            async with self._db().connection() as conn, conn.transaction(), conn.cursor() as cur:
                for sql, rows in steps:
                    # executemany runs in pipeline mode: one round trip per batch, not per row.
                    await cur.executemany(sql, rows)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise StoreDataError(str(exc)) from exc

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._db().connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        async with self._db().connection() as conn:
            cur = await conn.execute(sql, params)
            return cur.rowcount
