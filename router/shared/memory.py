"""In-process shared state: the embedded default, and the local fallback of the Redis state.

Every method body runs without awaiting until its state change is done, so each operation is
atomic with respect to other tasks on the event loop. Maps are bounded LRUs with expiry, but for
the budgets of keys (``lasting``), which are kept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from router.shared.memory_breaker import MemoryBreakers
from router.shared.types import (
    NANO,
    Allowed,
    AttemptMark,
    BudgetExceeded,
    Clock,
    Pin,
    Reservation,
    Spend,
    SpendSource,
    StateConfig,
    VersionCallback,
    Warm,
    to_nano,
)

V = TypeVar("V")

log = logging.getLogger(__name__)


class TTLCache(Generic[V]):
    """An LRU map whose entries also expire. Over ``max_entries`` the least recently used goes."""

    def __init__(self, max_entries: int, clock: Clock) -> None:
        self._data: OrderedDict[str, tuple[V, float]] = OrderedDict()
        self._max = max_entries
        self._clock = clock
        #: Entries dropped for room (not expired): their keys may come back to find nothing.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._data)

    def get_entry(self, key: str) -> tuple[V, float] | None:
        """The value and its expiry time, or None when absent or expired."""
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return entry

    def get(self, key: str) -> V | None:
        entry = self.get_entry(key)
        return None if entry is None else entry[0]

    def set(self, key: str, value: V, ttl_s: float) -> None:
        self._data[key] = (value, self._clock() + ttl_s)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)
            self.evicted += 1


def _positive_ttl(ttl_s: float) -> float:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
    return ttl_s


class MemorySessions:
    """Task pins, prompt-cache affinity and the tasks' latest attempts."""

    def __init__(self, config: StateConfig, clock: Clock) -> None:
        self._pins: TTLCache[str] = TTLCache(config.local_max_entries, clock)
        self._warm: TTLCache[str] = TTLCache(config.local_max_entries, clock)
        self._attempts: TTLCache[AttemptMark] = TTLCache(config.local_max_entries, clock)

    async def pin(self, task_id: str) -> Pin | None:
        entry = self._pins.get_entry(task_id)
        return None if entry is None else Pin(*entry)

    async def set_pin(self, task_id: str, model: str, ttl_s: float) -> None:
        self._pins.set(task_id, model, _positive_ttl(ttl_s))

    async def warm(self, task_id: str) -> Warm | None:
        entry = self._warm.get_entry(task_id)
        return None if entry is None else Warm(*entry)

    async def mark_warm(self, task_id: str, model: str, ttl_s: float) -> None:
        self._warm.set(task_id, model, _positive_ttl(ttl_s))

    async def attempt(self, task_id: str) -> AttemptMark | None:
        return self._attempts.get(task_id)

    async def count_call(self, task_id: str, attempt: int, ttl_s: float) -> None:
        mark = self._attempts.get(task_id) or AttemptMark(0)
        self._keep(task_id, mark.counted(attempt), ttl_s)

    async def mark_attempt(
        self, task_id: str, attempt: int, ttl_s: float, *, failed: bool, stop: tuple[str, str] | None = None
    ) -> None:
        mark = self._attempts.get(task_id) or AttemptMark(0)
        self._keep(task_id, mark.marked(attempt, failed, stop), ttl_s)

    def _keep(self, task_id: str, mark: AttemptMark | None, ttl_s: float) -> None:
        if mark is not None:
            self._attempts.set(task_id, mark, _positive_ttl(ttl_s))


@dataclass
class _Scope:
    spent: int = 0
    #: reservation id -> (amount in nano-USD, expiry)
    holds: dict[str, tuple[int, float]] = field(default_factory=dict)

    def purge(self, now: float) -> None:
        for rid in [rid for rid, (_, exp) in self.holds.items() if exp <= now]:
            del self.holds[rid]

    def reserved(self) -> int:
        return sum(amount for amount, _ in self.holds.values())


def unique_scopes(scope_keys: Sequence[str]) -> tuple[str, ...]:
    """Scopes in order, each once: a repeated scope must not be charged twice."""
    return tuple(dict.fromkeys(scope_keys))


def lasting(scope: str) -> bool:
    """Whether a budget scope is kept however long it is idle: all but tasks'. A key's budget is
    money its operator capped, and one quiet for 40 days, or pushed out by the tasks of others,
    got all of it again; a task's ends with its task, and there are as many as clients make up."""
    return not scope.startswith("task:")


class MemoryBudgets:
    """Task scopes live in a bounded LRU with idle expiry; the others (keys', a few per operator's
    key) in a plain map, never dropped."""

    def __init__(self, config: StateConfig, clock: Clock) -> None:
        self._scopes: TTLCache[_Scope] = TTLCache(config.local_max_entries, clock)
        self._lasting: dict[str, _Scope] = {}
        self._idle_ttl = max(config.budget_idle_ttl_s, config.reservation_ttl_s)
        self._default_ttl = config.reservation_ttl_s
        self._clock = clock

    def _scope(self, name: str) -> _Scope:
        if lasting(name):
            scope = self._lasting.setdefault(name, _Scope())
            scope.purge(self._clock())
            return scope
        found = self._scopes.get(name)
        scope = _Scope() if found is None else found
        scope.purge(self._clock())
        self._scopes.set(name, scope, self._idle_ttl)
        return scope

    def _peek(self, name: str) -> _Scope | None:
        return self._lasting.get(name) if lasting(name) else self._scopes.get(name)

    async def reserve(
        self,
        scope_keys: Sequence[str],
        amount_usd: float,
        limits: Mapping[str, float],
        *,
        ttl_s: float | None = None,
        more: Mapping[str, float] | None = None,
        upto: Mapping[str, float] | None = None,
    ) -> Reservation:
        more, upto = dict(more or {}), upto or {}
        ttl = _positive_ttl(self._default_ttl if ttl_s is None else ttl_s)
        names = unique_scopes(scope_keys)
        wanted = [(n, self._scope(n), to_nano(amount_usd + more.get(n, 0.0))) for n in names]
        for name, scope, amount in wanted:
            limit = limits.get(name)
            if limit is not None and scope.spent + scope.reserved() + amount > to_nano(limit):
                raise BudgetExceeded(
                    name, limit, scope.spent / NANO, scope.reserved() / NANO, amount_usd + more.get(name, 0.0)
                )
        rid = uuid.uuid4().hex
        expiry = self._clock() + ttl
        for name, scope, amount in wanted:
            limit = limits.get(name)
            extra = max(0, to_nano(upto.get(name, 0.0)))
            if extra and limit is not None:
                extra = min(extra, max(0, to_nano(limit) - scope.spent - scope.reserved() - amount))
            if extra:
                more[name] = more.get(name, 0.0) + extra / NANO
            scope.holds[rid] = (amount + extra, expiry)
        return Reservation(rid, names, amount_usd, expiry, ttl, more=more)

    async def settle(self, reservation: Reservation, actual_usd: float) -> None:
        actual = to_nano(actual_usd)
        if reservation.closed:
            return
        reservation.closed = True
        for name in reservation.scopes:
            scope = self._scope(name)
            scope.holds.pop(reservation.id, None)
            scope.spent += actual

    async def release(self, reservation: Reservation) -> None:
        if reservation.closed:
            return
        reservation.closed = True
        for name in reservation.scopes:
            self._scope(name).holds.pop(reservation.id, None)

    async def extend(self, reservation: Reservation) -> bool:
        if reservation.closed:
            return False
        expiry = self._clock() + reservation.ttl_s
        live = False
        for name in reservation.scopes:
            if self._peek(name) is None:
                continue
            scope = self._scope(name)  # purged, and a task's kept from idling out meanwhile
            if (held := scope.holds.get(reservation.id)) is not None:
                scope.holds[reservation.id] = (held[0], expiry)
                live = True
        if live:
            reservation.expires_at = expiry
        return live

    def restore_from(self, source: SpendSource) -> None:
        """Nothing to do: in-process counts are lost only with the process, and a new one starts
        from the log (``router.http.admission.restore_spend``, ``recall_spend``)."""

    def active_since(self) -> float:
        """A task scope last used before this time has been forgotten (``budget_idle_ttl_s``):
        the spend of tasks restored from the log must come from those used since, as Redis
        forgets them too. Lasting scopes (``lasting``) restore their whole spend."""
        return self._clock() - self._idle_ttl

    def forgotten(self, scope: str) -> bool:
        """Whether ``scope`` may have been dropped for room (so its spend must be looked up). A
        lasting scope never is: the start restored every one with spend in the log."""
        return not lasting(scope) and self._scopes.evicted > 0 and self._scopes.get(scope) is None

    def restore(self, spent_usd: Mapping[str, float]) -> None:
        """Start scopes from spend recorded elsewhere (the log, after a restart)."""
        for name, usd in spent_usd.items():
            self._scope(name).spent += to_nano(max(0.0, usd))

    async def spent(self, scope: str) -> Spend:
        entry = self._peek(scope)
        if entry is None:
            return Spend(0.0, 0.0)
        entry.purge(self._clock())
        return Spend(entry.spent / NANO, entry.reserved() / NANO)


@dataclass
class _Window:
    events: deque[tuple[float, int, int]] = field(default_factory=deque)
    requests: int = 0
    tokens: int = 0

    def expire(self, cutoff: float) -> None:
        while self.events and self.events[0][0] <= cutoff:
            _, r, t = self.events.popleft()
            self.requests -= r
            self.tokens -= t

    def wait_until_freed(self, need: int, index: int, window: float) -> float:
        """The time at which the oldest events have freed ``need`` of field ``index``."""
        freed: float = 0
        for event in self.events:
            freed += event[index]
            if freed >= need:
                return event[0] + window
        return self.events[-1][0] + window if self.events else 0.0


class MemoryRateLimits:
    """Sliding-window log per key: a request is admitted when the window holds room for it."""

    def __init__(self, config: StateConfig, clock: Clock) -> None:
        self._windows: TTLCache[_Window] = TTLCache(config.local_max_entries, clock)
        self._window_s = config.rate_window_s
        self._clock = clock

    def _get(self, key: str, now: float) -> _Window:
        window = self._windows.get(key) or _Window()
        window.expire(now - self._window_s)
        return window

    async def check_and_consume(
        self, key: str, *, requests: int = 1, tokens: int = 0, rpm: int | None, tpm: int | None
    ) -> Allowed:
        if requests < 0 or tokens < 0:
            raise ValueError("requests and tokens must be >= 0")
        return self._admit(key, requests, tokens, rpm, tpm)

    async def adjust(self, key: str, delta_tokens: int) -> None:
        """Correct the token estimate once the real count is known (negative gives tokens back)."""
        self._admit(key, 0, delta_tokens, None, None)

    def _admit(self, key: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> Allowed:
        now = self._clock()
        if (rpm is not None and requests > rpm) or (tpm is not None and tokens > tpm):
            return Allowed(False, math.inf, "too_large")
        w = self._get(key, now)
        until, reason = -math.inf, ""
        if rpm is not None and w.requests + requests > rpm:
            until, reason = w.wait_until_freed(w.requests + requests - rpm, 1, self._window_s), "rpm"
        if tpm is not None and max(w.tokens, 0) + tokens > tpm:
            t_until = w.wait_until_freed(w.tokens + tokens - tpm, 2, self._window_s)
            if t_until > until:
                until, reason = t_until, "tpm"
        if reason:
            self._windows.set(key, w, self._window_s)
            return Allowed(False, max(until - now, 0.0), reason)
        w.events.append((now, requests, tokens))
        w.requests += requests
        w.tokens += tokens
        self._windows.set(key, w, self._window_s)
        return Allowed(True)


class MemoryPolicyVersion:
    """The promoted policy version; ``publish_version`` awaits every watcher's callback in turn."""

    def __init__(self) -> None:
        self._version: str | None = None
        self._callbacks: list[VersionCallback] = []

    async def current_version(self) -> str | None:
        return self._version

    async def publish_version(self, version: str) -> None:
        self._version = version
        for callback in list(self._callbacks):
            await deliver_version(callback, version)

    async def watch(self, callback: VersionCallback, *, known: str | None = None) -> None:
        """Runs until cancelled. Reports the current version first if it differs from ``known``."""
        last = known

        async def on_version(version: str) -> None:
            nonlocal last
            if version != last:
                last = version
                await deliver_version(callback, version)

        self._callbacks.append(on_version)
        try:
            if self._version is not None:
                await on_version(self._version)
            await asyncio.Event().wait()
        finally:
            self._callbacks.remove(on_version)


async def deliver_version(callback: VersionCallback, version: str) -> None:
    try:
        await callback(version)
    except Exception:
        # One broken watcher must not stop the others or the publisher.
        log.exception("policy version callback failed for version %r", version)


class MemoryState:
    """All components in this process. Never degraded, never raises ``StateUnavailable``."""

    def __init__(self, config: StateConfig | None = None, *, clock: Clock = time.time) -> None:
        self.config = config or StateConfig()
        self.sessions = MemorySessions(self.config, clock)
        self.budgets = MemoryBudgets(self.config, clock)
        self.limits = MemoryRateLimits(self.config, clock)
        self.breakers = MemoryBreakers(self.config.breaker, clock)
        self.policy = MemoryPolicyVersion()
        self._no_counts: Mapping[str, int] = MappingProxyType({})

    @property
    def degraded(self) -> bool:
        return False

    @property
    def fail_open_counts(self) -> Mapping[str, int]:
        return self._no_counts

    @property
    def fail_closed_counts(self) -> Mapping[str, int]:
        return self._no_counts

    @property
    def last_error(self) -> str | None:
        return None

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None
