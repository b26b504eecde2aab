"""Reading a time window of the log, for ``router report`` and ``router tasks`` (SQLite or PostgreSQL)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from router.errors import ConfigError
from router.store import OutcomeRecord, RequestRecord, Store, mask_url, open_store

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_DURATION_S = 50 * 365 * 86400


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w``, ``1h30m`` → seconds."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(
            f"duration {text!r}: expected a number with a unit s, m, h, d or w (e.g. 24h, 1h30m)"
        )
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    # Further back than the epoch is no time at all: "99999999999999999999w" was an OverflowError
    # traceback in `router prune` (and a date before year 1 anywhere else).
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"duration {text!r} is longer than {MAX_DURATION_S // (365 * 86400)} years")
    return seconds


@dataclass(slots=True)
class Window:
    since: float  # unix seconds
    until: float
    requests: list[RequestRecord]  # oldest first
    outcomes: list[OutcomeRecord]


def _check_exists(url: str) -> None:
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "sqlite" and rest[1:] != ":memory:" and not Path(rest[1:]).exists():
        raise ConfigError(f"log store {mask_url(url)}: no such file {rest[1:]!r}")


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Store]:
    """The store, open for reading; a SQLite file that does not exist is an error, not a new log."""
    _check_exists(url)
    store = open_store(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def latest_requests(
    store: Store, since: float, limit: int, without: Collection[str] = ()
) -> tuple[list[RequestRecord], bool]:
    """The latest ``limit`` requests from ``since`` on (less the columns ``without``), oldest first,
    and whether older ones of that span were left out (what a server reads for one look at a window)."""
    rows = await store.requests_since(since, limit + 1, without)
    return rows[-limit:], len(rows) > limit


async def read_window(url: str, seconds: float, now: float | None = None) -> Window:
    """Requests that arrived in the last ``seconds``, and outcomes recorded since then (an
    outcome comes after its task's requests, so this holds every verdict on those tasks)."""
    until = time.time() if now is None else now
    since = until - seconds
    async with opened(url) as store:
        requests = await store.requests_since(since)
        outcomes = await store.outcomes_since(since)
    return Window(since, until, [r for r in requests if r.ts <= until], outcomes)
