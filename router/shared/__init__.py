"""Shared state of the router's replicas: ``SharedState`` and ``open_state(redis_url)``.

Without a Redis URL everything lives in this process (``MemoryState``, the embedded default);
with one, every replica reads and writes the same Redis (``RedisState``). Both implement the
protocols below, with the same semantics, so callers never ask which one they hold::

    state = open_state(settings.redis)            # None -> in-process
    pin = await state.sessions.pin(task_id)
    res = await state.budgets.reserve([f"key:{key_id}", f"task:{task_id}"], 0.02, limits)
    try: ...call...; await state.budgets.settle(res, actual_usd)
    finally: await state.budgets.release(res)     # no-op after settle
    if not await state.breakers.before_call(backend): ...skip backend...
    verdict = await state.limits.check_and_consume(key_id, tokens=n, rpm=60, tpm=100_000)
    background.spawn(state.policy.watch(on_new_version, known=loaded), name="policy-watch")
    await state.aclose()

Ids (task ids, scope names, backend names) are opaque strings; ids longer than 200 characters
are hashed in Redis key names. Scope names and reasons appear in ``BudgetExceeded`` messages,
so use key ids, never secrets. A budget has no period: put one in the scope (``key:abc:2025-06``).

Redis key layout (prefix ``StateConfig.prefix``, default ``router:``; times on the Redis clock):

=================================  =====  ===================================================
``pin:{task}``                     str    pinned model; PX = pin TTL
``warm:{task}``                    str    backend holding the warm prefix; PX = TTL
``attempt:{task}``                 hash   latest ``attempt``, its ``calls``, ``failed``, stop ``why`` / ``rule``; PX = pin TTL
``budget:spent:{scope}``           hash   ``spent``, ``reserved`` (integer nano-USD); PX idle (a task's; a key's: none)
``budget:exp:{scope}``             zset   reservation id -> expiry (ms); PX idle (a task's; a key's: none)
``budget:amt:{scope}``             hash   reservation id -> amount (nano-USD); PX idle (a task's; a key's: none)
``budget:done:{reservation}``      str    the reservation was settled (retries count once); PX 1 hour
``budget:restored:2``              str    the budget counts are whole (absent: restore from the log)
``rl:log:{key}``                   zset   ``"{id}:{requests}:{tokens}"`` -> time (ms); PX window
``rl:sum:{key}``                   hash   ``req``, ``tok`` sums of the log; PX window
``breaker:state:{backend}``        hash   ``failures``, ``suspect*`` (while closed), ``open_until`` (ms)
``breaker:probe:{backend}``        str    half-open probe lock; SET NX PX probe TTL
``policy:version``                 str    promoted policy version (no TTL, like ``budget:restored:2``)
``policy:events``                  chan   pub/sub: a version was published
=================================  =====  ===================================================

Atomicity (Redis): budgets, rate limits and breaker transitions are single Lua scripts, so each
check-and-update is atomic across replicas. ``reserve`` checks ``spent + reserved + amount <=
limit`` for every scope, then holds the amount in all of them, or in none: concurrent reserves
never over-commit a limit. A hold carries a TTL (``ttl_s``, default ``reservation_ttl_s``) in the
scope's expiry zset; every script purges the scope's expired holds first, so a crashed replica's
reservations stop counting after their TTL with no janitor; a request that runs longer renews its
holds (``extend``) while it runs. ``settle`` drops the hold and adds
the actual cost, which may differ from the hold: a limit can be passed only by actual costs that
exceed their own reservations, never by concurrent reserves. Pins are last-writer-wins; an
attempt's mark only moves forward (a write for an earlier attempt than the stored one is dropped). Scripts
use several keys, so this needs one Redis (or Sentinel), not Cluster.

Failure (Redis): every call has a hard timeout (``op_timeout_s``, socket timeouts under it, a
bounded pool wait). On failure Redis is skipped for ``backoff_s``, then tried again: recovery is
automatic. Meanwhile budgets (and ``publish_version``) FAIL CLOSED with ``StateUnavailable``
(a 503); pins, affinity, rate limits, breakers and ``current_version`` FAIL OPEN to the
replica's in-process state, each counted in ``fail_open_counts`` by component (``sessions``,
``rate_limits``, ``breakers``, ``policy``). ``degraded`` is true from a failed call until the next
success (the policy watcher's poll keeps it fresh); ``ping()`` checks now. Refusals are counted
in ``fail_closed_counts`` (``budgets``, ``policy``). Pin, affinity and breaker writes are mirrored
locally while Redis is up, so the fallback knows this replica's own tasks; local rate limits
start empty, so during an outage each replica admits up to the full limit by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from router.shared.memory import MemoryState
from router.shared.types import (
    Allowed,
    AttemptMark,
    BreakerConfig,
    BreakerState,
    BudgetExceeded,
    Pin,
    Reservation,
    Spend,
    SpendSource,
    StateConfig,
    StateUnavailable,
    VersionCallback,
    Warm,
)

__all__ = [
    "Allowed",
    "AttemptMark",
    "BreakerConfig",
    "BreakerState",
    "Breakers",
    "BudgetExceeded",
    "Budgets",
    "MemoryState",
    "Pin",
    "PolicyVersion",
    "RateLimits",
    "Reservation",
    "Sessions",
    "SharedState",
    "Spend",
    "SpendSource",
    "StateConfig",
    "StateUnavailable",
    "VersionCallback",
    "Warm",
    "open_state",
]


class Sessions(Protocol):
    """Task pins (which model a task stays on), prompt-cache affinity (which backend holds the
    task's warm prefix) and each task's latest attempt (what a call cap counts, what opens the next
    attempt). Entries expire after their TTL; setting again replaces and re-arms."""

    async def pin(self, task_id: str) -> Pin | None: ...

    async def set_pin(self, task_id: str, model: str, ttl_s: float) -> None: ...

    async def warm(self, task_id: str) -> Warm | None: ...

    async def mark_warm(self, task_id: str, model: str, ttl_s: float) -> None: ...

    async def attempt(self, task_id: str) -> AttemptMark | None:
        """The task's latest attempt as the replicas last wrote it (None: none written, or expired)."""
        ...

    async def count_call(self, task_id: str, attempt: int, ttl_s: float) -> None:
        """A main-loop call of ``attempt`` was served (a later attempt starts its count at 1)."""
        ...

    async def mark_attempt(
        self, task_id: str, attempt: int, ttl_s: float, *, failed: bool, stop: tuple[str, str] | None = None
    ) -> None:
        """``attempt`` failed (or, a later outcome says, did not), or the router stopped it: (why, rule).
        Only a stop opens an attempt later than the stored one (``AttemptMark.marked``)."""
        ...


class Budgets(Protocol):
    """Spend per scope (a key, a task, ...), in USD. Raise ``StateUnavailable`` when they cannot
    be checked: they fail closed."""

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
        """Hold ``amount_usd`` in every scope at once, and ``more[scope]`` on top of it in the
        scopes ``more`` names, or raise ``BudgetExceeded`` naming the first scope it would take
        over ``limits[scope]``; scopes absent from ``limits`` are unlimited but still counted.
        Then, in the same step, ``upto[scope]`` on top in the scopes it names, as much of it as
        the scope's limit leaves room for (never refused for it; ``Reservation.more`` says what
        was held). The hold lapses after ``ttl_s`` unless settled or released first."""
        ...

    async def settle(self, reservation: Reservation, actual_usd: float) -> None:
        """Replace the hold by the actual spend (counted even if the hold had lapsed). Once only:
        later settle/release calls on the same reservation do nothing."""
        ...

    async def release(self, reservation: Reservation) -> None:
        """Drop the hold, spending nothing (the call failed). A no-op after settle."""
        ...

    async def extend(self, reservation: Reservation) -> bool:
        """Hold on for another ``reservation.ttl_s`` from now, in every scope that still holds it
        (a request that runs longer than the TTL keeps its hold by renewing it). Returns whether
        any did: a hold that has lapsed, or been settled or released, is not made again."""
        ...

    async def spent(self, scope: str) -> Spend: ...

    def restore_from(self, source: SpendSource) -> None:
        """Where spend comes from when the counts are found lost (Redis restarted empty): every
        scope is restored from ``source`` before the next reserve or read answers."""
        ...


class RateLimits(Protocol):
    """Sliding-window limits per key: at most ``rpm`` requests and ``tpm`` tokens in any window
    of ``StateConfig.rate_window_s`` (60 s by default)."""

    async def check_and_consume(
        self, key: str, *, requests: int = 1, tokens: int = 0, rpm: int | None, tpm: int | None
    ) -> Allowed:
        """Admit and count the request, or refuse it (consuming nothing) with how long until it
        would fit. ``None`` limits are not checked. Tokens are the estimate, counted up front."""
        ...

    async def adjust(self, key: str, delta_tokens: int) -> None:
        """Optional correction once the real token count is known (negative gives tokens back)."""
        ...


class Breakers(Protocol):
    """A circuit breaker per backend: ``closed`` -> ``failure_threshold`` consecutive retryable
    failures -> ``open`` for ``cooldown_s`` -> ``half_open``: one probe is admitted; its success
    closes, its retryable failure re-opens. Results arriving during the cool-down are ignored."""

    async def before_call(self, backend: str) -> bool:
        """Whether to call the backend now; True in half-open means "you are the probe": report
        its result with ``record_success`` / ``record_failure``."""
        ...

    async def record_success(self, backend: str) -> None: ...

    async def record_failure(self, backend: str, retryable: bool, *, caused_by: str | None = None) -> None:
        """Only retryable failures count; a non-retryable one (the backend answered) frees the
        half-open probe slot and changes nothing else. ``caused_by`` names the tenant whose
        request may have caused the failure (a long reply given up by a timeout): one tenant's
        such failures count once toward opening, until another tenant's fails so too; in
        half-open one frees the probe slot like a non-retryable one."""
        ...

    async def state(self, backend: str) -> BreakerState: ...

    def local_states(self) -> dict[str, BreakerState]:
        """This replica's view of every breaker it has touched, without I/O (for /metrics)."""
        ...


class PolicyVersion(Protocol):
    async def current_version(self) -> str | None: ...

    async def publish_version(self, version: str) -> None:
        """Make ``version`` current for every replica (watchers hear within ~``poll_interval_s``)."""
        ...

    async def watch(self, callback: VersionCallback, *, known: str | None = None) -> None:
        """Run until cancelled, awaiting ``callback(version)`` each time the current version
        differs from the last one delivered (initially ``known``). Callback errors are logged."""
        ...


class SharedState(Protocol):
    @property
    def sessions(self) -> Sessions: ...

    @property
    def budgets(self) -> Budgets: ...

    @property
    def limits(self) -> RateLimits: ...

    @property
    def breakers(self) -> Breakers: ...

    @property
    def policy(self) -> PolicyVersion: ...

    @property
    def degraded(self) -> bool:
        """True while the shared store is failing and local fallbacks answer (for ``/readyz``)."""
        ...

    @property
    def fail_open_counts(self) -> Mapping[str, int]:
        """Calls answered from local state because Redis could not, by component (for metrics)."""
        ...

    @property
    def fail_closed_counts(self) -> Mapping[str, int]:
        """Calls refused with ``StateUnavailable`` because Redis could not answer, by component."""
        ...

    @property
    def last_error(self) -> str | None:
        """What the last failed Redis call said (for logs and ``/readyz`` details, never clients)."""
        ...

    async def ping(self) -> bool:
        """Whether the shared store answers now; never raises."""
        ...

    async def aclose(self) -> None: ...


def open_state(redis_url: str | None, config: StateConfig | None = None) -> SharedState:
    """``MemoryState`` without a URL, else ``RedisState`` (no I/O here: it connects on first use,
    so a replica starts, degraded, even while Redis is down). A malformed URL is a ``ConfigError``."""
    if not redis_url:
        return MemoryState(config)
    from router.shared.redis import RedisState  # keeps redis-py out of the embedded default's imports

    return RedisState(redis_url, config)
