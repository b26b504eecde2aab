"""The SQLite log store: stdlib sqlite3 on one connection owned by one worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from router.background import worker_pool
from router.errors import ConfigError
from router.store import schema
from router.store.records import StoreDataError
from router.store.sql import SQLStore

T = TypeVar("T")


#: Rows per statement, largest first. sqlite3 gives up the GIL while it steps a statement and takes
#: it back after: with ``executemany``'s one statement a row, the writer thread took the GIL from the
#: event loop once a row (two rows a request, a request and its label), which cost more in futex
#: calls and thread switches than the inserts did. A multi-row ``VALUES`` is one step for many rows;
#: the few sizes keep the statement cache small (64 rows of the widest table: 4,032 parameters, far
#: below SQLite's 32,766).
ROWS_PER_STATEMENT = (64, 8, 1)


#: How long opening waits for another process's write to the file before switching it to WAL.
WAL_WAIT_S = 10.0


def _wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL. Switching a file still in the rollback journal upgrades a read lock
    to an exclusive one, and while another connection holds the write lock (another process
    opening the same log, in its migration) SQLite answers "database is locked" at once instead of
    waiting (a wait could deadlock): so the switch is tried again until that write is done."""
    deadline = time.monotonic() + WAL_WAIT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class SQLiteStore(SQLStore):
    """Every database call runs on a single dedicated thread, so the one connection is never shared."""

    dialect = "sqlite"

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None or self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"{self!r} is not open")
        return self._conn

    async def open(self) -> None:
        if self._executor is not None:
            return
        executor = worker_pool("sqlite-store", max_workers=1)
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._open_sync)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor

    def _open_sync(self) -> None:
        try:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
                # Readable by its owner alone (SQLite gives the WAL and shared-memory files the
                # database's mode): with the default umask the log, opted-in prompts included,
                # was readable by every user of the machine.
                os.close(os.open(self._path, os.O_CREAT | os.O_WRONLY, 0o600))
            # Autocommit mode: transactions are explicit below, DDL included.
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open SQLite log store {self._path!r}: {exc}") from exc
        try:
            try:
                _wal(conn)
            except sqlite3.DatabaseError as exc:  # SQLite reads the file first here: a traceback before
                raise ConfigError(f"cannot open SQLite log store {self._path!r}: {exc}") from exc
            conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate(conn)
            for table in schema.TABLES:
                present = [r[1] for r in conn.execute(f"PRAGMA table_info({table.name})")]
                missing = schema.missing_columns(table, present)
                if missing:
                    raise RuntimeError(
                        f"{self!r}: table {table.name} lacks columns {missing}; a record field was added "
                        "without metadata={'since': N}"
                    )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute(schema.version_table_ddl("sqlite"))
        # IMMEDIATE takes the write lock before reading the version, so two processes opening
        # the same file cannot both apply a migration.
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            for version, stmts in schema.migrations("sqlite"):
                if version <= current:
                    continue
                for stmt in stmts:
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time())
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=False)

    async def ping(self) -> bool:
        try:
            return bool(await self._run(lambda: self._db().execute("SELECT 1").fetchone()[0] == 1))
        except Exception:
            return False

    async def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        # Every one is a one-row ``INSERT ... VALUES``: the rows go in a few statements.
        await self._run(self._write_sync, [(sql, rows)], _insert)

    async def _transaction(self, steps: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        await self._run(self._write_sync, steps)

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await self._run(lambda: self._db().execute(sql, params).fetchall())

    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        return await self._run(lambda: self._db().execute(sql, params).rowcount)

    def _write_sync(
        self, steps: list[tuple[str, list[tuple[Any, ...]]]],
        run: Callable[[sqlite3.Connection, str, list[tuple[Any, ...]]], object] = sqlite3.Connection.executemany,
    ) -> None:  # fmt: skip
        conn = self._db()
        _rollback(conn)  # a transaction an earlier failure left open would refuse this BEGIN forever
        conn.execute("BEGIN")
        try:
            for sql, rows in steps:
                run(conn, sql, rows)
            conn.execute("COMMIT")
        except (sqlite3.IntegrityError, sqlite3.DataError) as exc:
            _rollback(conn)
            raise StoreDataError(str(exc)) from exc
        except BaseException:
            _rollback(conn)
            raise


def _insert(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """``conn.executemany(sql, rows)`` for a one-row ``INSERT ... VALUES (...)``, in as few
    statements as ``ROWS_PER_STATEMENT`` allows (rows go in in their order, so an upsert's later
    row of a key still wins)."""
    i = 0
    for k in ROWS_PER_STATEMENT:
        while len(rows) - i >= k:
            conn.execute(_rows_sql(sql, k), list(itertools.chain.from_iterable(rows[i : i + k])))
            i += k


@functools.cache
def _rows_sql(sql: str, k: int) -> str:
    """``sql``, an ``INSERT ... VALUES (?, ...) ...`` of one row, for ``k`` rows."""
    head, _, tail = sql.partition(" VALUES (")
    end = tail.index(")")
    row = "(" + tail[: end + 1]
    return head + " VALUES " + ", ".join([row] * k) + tail[end + 1 :]


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is open, if anything: after a full disk (SQLITE_FULL) SQLite has already
    rolled back, and a ROLLBACK then would raise "no transaction is active" in place of the
    error that says what happened."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
