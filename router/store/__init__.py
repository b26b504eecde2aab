"""The router's request/outcome log: the ``Store`` interface and ``open_store(url)``.

URL forms: ``sqlite:///relative/path.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``,
``postgresql://...`` (or ``postgres://...``). Backends are imported lazily so SQLite users need
no PostgreSQL driver.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from router.errors import ConfigError
from router.store.records import KeyRecord, OutcomeRecord, RequestRecord, StoreDataError
from router.store.urls import mask_url, redact

__all__ = [
    "KeyRecord",
    "OutcomeRecord",
    "RequestRecord",
    "Store",
    "StoreDataError",
    "mask_url",
    "open_store",
    "redact",
]


class Store(Protocol):
    """The log store. Call ``open()`` before anything else and ``close()`` at shutdown."""

    async def open(self) -> None:
        """Connect and apply pending migrations."""

    async def close(self) -> None: ...

    async def ping(self) -> bool:
        """True when the database answers; never raises."""

    async def write_requests(self, records: Sequence[RequestRecord]) -> None:
        """Encode (``schema.encode_request``) and ``write_rows``."""

    async def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert request rows (``schema.encode_request``) in one transaction; a request_id
        already stored is skipped.

        Raises ``StoreDataError`` when the rows themselves are unacceptable; anything else
        means the store is unavailable and the same call may succeed later.
        """

    async def write_outcome(self, rec: OutcomeRecord) -> None:
        """Insert or replace the outcome for (task_id, attempt, source)."""

    async def write_outcome_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert or replace outcome rows (``schema.encode_outcome``) in one transaction, in order
        (a later row for the same (task_id, attempt, source) wins). Raises as ``write_rows``."""

    async def requests_for_task(self, task_id: str, limit: int | None = None) -> list[RequestRecord]:
        """Oldest first; with ``limit``, only the latest ``limit`` of them."""

    async def outcomes_for_task(self, task_id: str) -> list[OutcomeRecord]: ...

    async def requests_since(
        self, ts: float, limit: int | None = None, without: Collection[str] = ()
    ) -> list[RequestRecord]:
        """Every request from ``ts`` (unix seconds) on, oldest first; with ``limit``, only the
        latest ``limit`` of them. ``without``: columns not read (``router.store.rows.request_rows``)."""

    async def outcomes_since(self, ts: float) -> list[OutcomeRecord]:
        """Every outcome recorded from ``ts`` on."""

    async def spend_by(self, column: str, active_since: float) -> dict[str, float]:
        """Total ``cost_usd`` logged per ``key_id`` or per ``task_id`` (budgets seed from it), of
        those with a request logged at or after ``active_since`` (unix seconds)."""

    async def spend_of(self, column: str, value: str, active_since: float) -> float:
        """Total ``cost_usd`` logged for one ``key_id`` or ``task_id``; 0 unless it has a request
        logged at or after ``active_since``."""

    async def prune(self, before: float) -> int:
        """Delete the requests and outcomes older than ``before``, keeping their spend per key
        and task as summary rows (``schema.prune_sql``); the number of requests deleted."""

    async def create_key(self, rec: KeyRecord) -> None:
        """Insert a virtual key; raises ``StoreDataError`` if its id or hash is already stored."""

    async def get_key_by_hash(self, key_hash: str) -> KeyRecord | None:
        """The key with this SHA-256 (hex), revoked or not."""

    async def list_keys(self) -> list[KeyRecord]:
        """Every key ever created, revoked ones included, oldest first."""

    async def revoke_key(self, key_id: str, ts: float) -> bool:
        """Mark the key revoked at ``ts``; False when no such key or it was already revoked."""


def open_store(url: str) -> Store:
    """Build the store a URL names (not yet opened: ``await store.open()``)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "sqlite":
        # sqlite:///x.db -> "x.db"; sqlite:////abs/x.db -> "/abs/x.db": the host part must be empty.
        if not rest.startswith("/") or len(rest) < 2:
            raise ConfigError(
                f"log store URL {mask_url(url)!r}: expected sqlite:///relative/path.db or sqlite:////abs/path.db"
            )
        from router.store.sqlite import SQLiteStore

        return SQLiteStore(rest[1:])
    if sep and scheme in ("postgresql", "postgres"):
        try:
            from router.store.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigError(
                f"log store URL {mask_url(url)!r} needs psycopg 3 with its pool: "
                f"pip install 'psycopg[binary,pool]' ({exc})"
            ) from None
        return PostgresStore(url)
    raise ConfigError(
        f"log store URL {mask_url(url)!r}: unsupported scheme; use sqlite:///path.db or postgresql://..."
    )
