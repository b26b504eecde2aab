"""Every Redis call of the state layer goes through a ``RedisGuard``: a hard timeout, a back-off after a
failure (so a dead Redis costs one timeout per back-off window, not one per request), and the
fail-open / fail-closed bookkeeping behind ``degraded`` and the counters."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError, ResponseError

from router.shared.types import StateUnavailable

T = TypeVar("T")

log = logging.getLogger(__name__)


class RedisDown(Exception):
    """Redis did not answer (or is in its back-off window). ``reason`` is for logs only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RedisGuard:
    def __init__(
        self, op_timeout_s: float, backoff_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._op_timeout = op_timeout_s
        self._backoff = backoff_s
        self._clock = clock
        self._skip_until = 0.0
        self._down = False
        self.last_error: str | None = None
        self.fail_open_counts: dict[str, int] = {}
        self.fail_closed_counts: dict[str, int] = {}

    @property
    def degraded(self) -> bool:
        """True from a failed Redis call until the next successful one."""
        return self._down

    async def run(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis operation under the timeout; raise ``RedisDown`` on any failure."""
        if self._clock() < self._skip_until:
            raise RedisDown(f"in back-off after: {self.last_error}")
        try:
            async with asyncio.timeout(self._op_timeout):
                result = await op()
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            raise RedisDown(self.last_error or type(exc).__name__) from exc
        if self._down:
            log.warning("shared state: Redis is reachable again; leaving degraded mode")
            self._down = False
        return result

    def _failed(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self._skip_until = self._clock() + self._backoff
        if isinstance(exc, ResponseError):
            # Redis answered with an error: a bug (script, key type), not an outage. Still fail
            # open/closed as configured, but loudly.
            log.error("shared state: Redis error reply: %s", self.last_error)
        if not self._down:
            log.warning("shared state: Redis unavailable (%s); degraded until it answers", self.last_error)
            self._down = True

    async def fail_open(
        self, component: str, op: Callable[[], Awaitable[T]], fallback: Callable[[], Awaitable[T]]
    ) -> T:
        """Redis if it answers, else the local fallback (counted under ``component``)."""
        try:
            return await self.run(op)
        except RedisDown:
            self.fail_open_counts[component] = self.fail_open_counts.get(component, 0) + 1
            return await fallback()

    async def fail_closed(self, component: str, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Redis if it answers, else ``StateUnavailable`` (counted under ``component``)."""
        try:
            return await self.run(op)
        except RedisDown as exc:
            self.fail_closed_counts[component] = self.fail_closed_counts.get(component, 0) + 1
            raise StateUnavailable(what, exc.reason) from None
