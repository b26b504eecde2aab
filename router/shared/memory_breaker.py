"""The in-process circuit breaker: the embedded default, and the local mirror of the Redis one.

Every method body runs without awaiting until its state change is done, so each transition is
atomic with respect to other tasks on the event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from router.shared.types import BreakerConfig, BreakerState, Clock

#: Breaker changes, one warning each: this replica's view (with Redis, the local mirror of the shared breaker).
breaker_log = logging.getLogger("router.breakers")


@dataclass
class _Breaker:
    #: Failures in a row that are the backend's own (closed only).
    failures: int = 0
    #: Failures in a row a request may have caused (``caused_by``): how many, the first tenant's
    #: name, and whether another tenant's request has failed so too.
    suspect_failures: int = 0
    first_suspect: str | None = None
    many_suspects: bool = False
    open_until: float | None = None
    probe_until: float = 0.0

    def counted(self) -> int:
        """The failures that count: one tenant's suspect failures count once, two tenants' each."""
        suspects = self.suspect_failures if self.many_suspects else min(self.suspect_failures, 1)
        return self.failures + suspects


class MemoryBreakers:
    """closed -> (N consecutive retryable failures) -> open -> (cool-down) -> half_open, one probe
    -> closed on success / open again on a retryable failure. A failure one request may have
    caused (``caused_by``) counts once per tenant until a second tenant's fails too."""

    def __init__(self, config: BreakerConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._breakers: dict[str, _Breaker] = {}

    def _get(self, backend: str) -> _Breaker:
        return self._breakers.setdefault(backend, _Breaker())

    async def state(self, backend: str) -> BreakerState:
        return self._state(self._get(backend), self._clock())

    @staticmethod
    def _state(b: _Breaker, now: float) -> BreakerState:
        if b.open_until is None:
            return BreakerState.CLOSED
        return BreakerState.OPEN if now < b.open_until else BreakerState.HALF_OPEN

    def local_states(self) -> dict[str, BreakerState]:
        now = self._clock()
        return {backend: self._state(b, now) for backend, b in list(self._breakers.items())}

    async def before_call(self, backend: str) -> bool:
        b, now = self._get(backend), self._clock()
        if b.open_until is None:
            return True
        if now < b.open_until or now < b.probe_until:
            return False
        b.probe_until = now + self._config.probe_ttl_s
        return True

    async def record_success(self, backend: str) -> None:
        b = self._get(backend)
        if b.open_until is None:
            b.failures, b.suspect_failures, b.first_suspect, b.many_suspects = 0, 0, None, False
        elif self._clock() >= b.open_until:
            self._breakers[backend] = _Breaker()
            breaker_log.warning("breaker for %s closed: its probe call succeeded", backend)
        # A success while still cooling down comes from a call started before the breaker opened:
        # the cool-down stands.

    async def record_failure(self, backend: str, retryable: bool, *, caused_by: str | None = None) -> None:
        b, now = self._get(backend), self._clock()
        half_open = b.open_until is not None and now >= b.open_until
        if not retryable or (caused_by is not None and b.open_until is not None):
            # The backend answered, or a probe's request may have caused its own failure: no
            # evidence either way. A probe that got a 4xx frees its slot.
            if half_open:
                b.probe_until = 0.0
            return
        if b.open_until is None:
            if caused_by is None:
                b.failures += 1
            else:
                b.suspect_failures += 1
                if b.first_suspect is None:
                    b.first_suspect = caused_by
                elif b.first_suspect != caused_by:
                    b.many_suspects = True
            if b.counted() >= self._config.failure_threshold:
                self._breakers[backend] = _Breaker(open_until=now + self._config.cooldown_s)
                breaker_log.warning("breaker for %s opened after %d failures in a row: skipped for %.0f s",
                                    backend, self._config.failure_threshold, self._config.cooldown_s)  # fmt: skip
        elif half_open:
            b.open_until, b.probe_until = now + self._config.cooldown_s, 0.0
            breaker_log.warning("breaker for %s opened again: its probe call failed; skipped for %.0f s",
                                backend, self._config.cooldown_s)  # fmt: skip
