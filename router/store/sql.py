"""The log store's queries, written once for both SQL databases.

A backend supplies three primitives on its own connection handling — ``_write`` (rows in one
transaction; ``StoreDataError`` when the rows themselves are refused), ``_fetch`` (rows of a
query) and ``_execute`` (a statement's row count) — and its dialect; everything else is here.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import Any

from router.store import schema
from router.store.records import KeyRecord, OutcomeRecord, RequestRecord
from router.store.rows import KEY_ROWS, OUTCOME_ROWS, REQUEST_ROWS, Decoder, R, request_rows

#: Rows decoded on the event loop; more are decoded on a worker thread.
_DECODE_INLINE = 200


class SQLStore(ABC):
    """The queries both SQL stores share; each dialect supplies how a statement is run."""

    dialect: schema.Dialect

    def __init__(self) -> None:
        self._insert_requests = schema.insert_requests_sql(self.dialect)
        self._upsert_outcome = schema.upsert_outcome_sql(self.dialect)

    @abstractmethod
    async def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Implemented by each dialect."""

    @abstractmethod
    async def _transaction(self, steps: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Each statement with its rows, in order, in one transaction (implemented by each dialect)."""

    @abstractmethod
    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Implemented by each dialect."""

    @abstractmethod
    async def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        """Implemented by each dialect."""

    async def _select(
        self, rows_of: Decoder[R], where: str | None, param: Any, order: str, op: str = "=",
        limit: int | None = None,
    ) -> list[R]:  # fmt: skip
        sql = schema.select_sql(rows_of.table, self.dialect, where=where, order=order, op=op, limit=limit)
        rows = await self._fetch(sql, (param,) if where else ())
        if len(rows) <= _DECODE_INLINE:
            return rows_of.all(rows)
        # Decoding is Python per JSON column of each row: 20,000 rows of one task held the event
        # loop (every client) for seconds.
        return await asyncio.to_thread(rows_of.all, rows)

    async def write_requests(self, records: Sequence[RequestRecord]) -> None:
        await self.write_rows([schema.encode_request(r) for r in records])

    async def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            await self._write(self._insert_requests, list(rows))

    async def write_outcome(self, rec: OutcomeRecord) -> None:
        await self.write_outcome_rows([schema.encode_outcome(rec)])

    async def write_outcome_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            await self._write(self._upsert_outcome, list(rows))

    async def requests_for_task(self, task_id: str, limit: int | None = None) -> list[RequestRecord]:
        if limit is None:
            return await self._select(REQUEST_ROWS, "task_id", task_id, "ts, request_id")
        latest = await self._select(REQUEST_ROWS, "task_id", task_id, "ts DESC, request_id DESC", limit=limit)
        return latest[::-1]

    async def outcomes_for_task(self, task_id: str) -> list[OutcomeRecord]:
        return await self._select(OUTCOME_ROWS, "task_id", task_id, "attempt, source")

    async def requests_since(
        self, ts: float, limit: int | None = None, without: Collection[str] = ()
    ) -> list[RequestRecord]:
        rows_of = request_rows(frozenset(without))
        if limit is None:
            return await self._select(rows_of, "ts", ts, "ts, request_id", op=">=")
        latest = await self._select(rows_of, "ts", ts, "ts DESC, request_id DESC", op=">=", limit=limit)
        return latest[::-1]

    async def outcomes_since(self, ts: float) -> list[OutcomeRecord]:
        return await self._select(OUTCOME_ROWS, "ts", ts, "ts", op=">=")

    async def spend_by(self, column: str, active_since: float) -> dict[str, float]:
        rows = await self._fetch(schema.spend_sql(column, self.dialect), (active_since,))
        return {str(k): float(v) for k, v in rows}

    async def spend_of(self, column: str, value: str, active_since: float) -> float:
        rows = await self._fetch(schema.spend_sql(column, self.dialect, one=True), (value, active_since))
        return float(rows[0][1]) if rows else 0.0

    async def prune(self, before: float) -> int:
        tag = f"{before:.6f}"
        counted = await self._fetch(schema.count_before_sql(self.dialect), (before,))
        insert, delete_requests, delete_outcomes = schema.prune_sql(self.dialect)
        await self._transaction(
            [(insert, [(tag, before)]), (delete_requests, [(before, tag)]), (delete_outcomes, [(before,)])]
        )
        return int(counted[0][0])

    async def create_key(self, rec: KeyRecord) -> None:
        await self._write(schema.insert_key_sql(self.dialect), [schema.encode_key(rec)])

    async def get_key_by_hash(self, key_hash: str) -> KeyRecord | None:
        rows = await self._fetch(schema.select_sql(schema.KEYS, self.dialect, where="key_hash"), (key_hash,))
        return KEY_ROWS.one(rows[0]) if rows else None

    async def list_keys(self) -> list[KeyRecord]:
        rows = await self._fetch(schema.select_sql(schema.KEYS, self.dialect, order="created_at, key_id"))
        return KEY_ROWS.all(rows)

    async def revoke_key(self, key_id: str, ts: float) -> bool:
        return await self._execute(schema.revoke_key_sql(self.dialect), (ts, key_id)) > 0
