"""Values, settings and errors of the shared state layer (the contracts are in ``router.shared``)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from router.errors import PermissionDenied, ServiceUnavailable

#: Seconds, monotonic or wall: each in-process store takes one (tests pass a fake).
Clock = Callable[[], float]

#: Budgets are counted in integer nano-dollars so that sums are exact (Lua and Python agree).
NANO = 1_000_000_000

VersionCallback = Callable[[str], Awaitable[None]]

#: Where budgets restore spend from (the log): the total per scope, of every lasting scope
#: (``key:…``, ``router.shared.memory.lasting``) and of the task scopes (``task:…``) used at or
#: after the given time (unix seconds).
SpendSource = Callable[[float], Awaitable[Mapping[str, float]]]


def to_nano(usd: float) -> int:
    if not math.isfinite(usd) or usd < 0:
        raise ValueError(f"a USD amount must be finite and >= 0, got {usd!r}")
    return round(usd * NANO)


class Pin(NamedTuple):
    """The model a task is pinned to, and until when (wall-clock epoch seconds)."""

    model: str
    until: float


class Warm(NamedTuple):
    """The backend model holding a task's warm prompt prefix, and until when (epoch seconds)."""

    model: str
    until: float


class AttemptMark(NamedTuple):
    """What the replicas share of a task's latest attempt: its number, the main-loop calls served in
    it (a cap counts them wherever they were served), whether it is known to have failed (an
    outcome said so, or the router stopped it: the next restart of the conversation opens the next
    attempt), and, if the router stopped it, (why, rule) as the agent was told."""

    attempt: int
    calls: int = 0
    failed: bool = False
    stop: tuple[str, str] | None = None

    def counted(self, attempt: int) -> AttemptMark | None:
        """After a call of ``attempt`` was served (None: the mark is of a later attempt, kept)."""
        if attempt > self.attempt:
            return AttemptMark(attempt, 1)
        return self._replace(calls=self.calls + 1) if attempt == self.attempt else None

    def marked(self, attempt: int, failed: bool, stop: tuple[str, str] | None) -> AttemptMark | None:
        """After ``attempt`` was found failed (or not, by a later outcome), or stopped (None: kept).
        Only the router's stop opens an attempt no call was counted in: an outcome a client posts
        about an attempt that never ran (``attempt: 50``) moves nothing forward."""
        if attempt < self.attempt or (attempt > self.attempt and stop is None):
            return None
        base = AttemptMark(attempt) if attempt > self.attempt else self
        return base._replace(failed=failed, stop=stop or base.stop)


class Spend(NamedTuple):
    """Dollars of one budget scope: settled spend, and the sum of live reservations."""

    spent: float
    reserved: float


@dataclass(slots=True)
class Reservation:
    """A hold on budget in every scope at once. ``closed`` is set by the first settle/release."""

    id: str
    scopes: tuple[str, ...]
    amount_usd: float
    #: Local wall-clock estimate; the authoritative expiry is the store's own clock.
    expires_at: float
    #: The hold's lifetime: it lapses this long after it was made or last renewed (``extend``).
    ttl_s: float
    closed: bool = False
    #: Held on top of ``amount_usd`` in some of the scopes (``Budgets.reserve``'s ``more``).
    more: Mapping[str, float] = field(default_factory=dict)

    def held_in(self, scope: str) -> float:
        """What this reservation holds in ``scope`` (0 in a scope it does not hold in)."""
        return self.amount_usd + self.more.get(scope, 0.0) if scope in self.scopes else 0.0


@dataclass(frozen=True, slots=True)
class Allowed:
    """A rate-limit verdict. Truthy when allowed. ``reason`` is ``""``, ``"rpm"``, ``"tpm"`` or
    ``"too_large"`` (the request alone exceeds a limit: waiting cannot help, ``retry_after_s`` is inf)."""

    ok: bool
    retry_after_s: float = 0.0
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    #: Consecutive retryable failures that open the breaker.
    failure_threshold: int = 5
    #: How long an open breaker refuses calls before it admits one probe.
    cooldown_s: float = 30.0
    #: A probe that never reports back frees its slot after this long (set >= the request deadline).
    probe_ttl_s: float = 60.0


#: A hold's lifetime unless renewed: running requests renew theirs every half of it
#: (``Admission.keep``), so all it sets is how long a crashed replica's holds keep its keys' and
#: tasks' money from everyone. At 600 s a key with a $0.5 budget, $0.4386 of it held by the streams
#: of a replica killed mid-stream, was refused (429 ``budget_held``) on every replica for 10
#: minutes. At 60 s a renewal is due 30 s before its hold lapses, and one that fails is tried again
#: every second meanwhile: an event-loop stall or a Redis outage of up to about 30 s loses no hold
#: (longer, and a running request's money may be held again by others on the replicas that still
#: reach Redis). It costs one renewal per running request per 30 s.
HOLD_TTL_S = 60.0


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Tuning of both implementations; the Redis-only fields are ignored by the in-process one."""

    #: Every Redis key and the pub/sub channel start with this.
    prefix: str = "router:"
    #: Per-socket-operation and connect timeouts of every Redis connection.
    socket_timeout_s: float = 0.3
    connect_timeout_s: float = 0.3
    #: Cap on one whole state call (pool wait + connect + round trip): no call waits longer.
    op_timeout_s: float = 0.5
    pool_size: int = 32
    #: How long a call waits for a free pooled connection.
    pool_timeout_s: float = 0.2
    #: After a Redis failure, calls skip Redis (fallback / StateUnavailable) for this long.
    backoff_s: float = 1.0
    #: Default lifetime of a budget reservation that is neither settled nor released: how long a
    #: crashed replica's holds keep their money (``HOLD_TTL_S``).
    reservation_ttl_s: float = HOLD_TTL_S
    #: A task's budget scope untouched this long is forgotten; a key's never is.
    budget_idle_ttl_s: float = 40 * 86400.0
    #: The sliding window of the rate limits: ``rpm``/``tpm`` are counts per this many seconds.
    rate_window_s: float = 60.0
    #: Entry cap of each in-process LRU map (pins, warm prefixes, rate windows, tasks' budgets).
    local_max_entries: int = 100_000
    #: The policy-version watcher re-reads the key this often, for replicas that missed a message.
    poll_interval_s: float = 1.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)


class BudgetExceeded(PermissionDenied):
    """Reserving ``amount_usd`` would take ``scope`` over its limit. A cheaper candidate may fit."""

    next_candidate = True

    def __init__(
        self, scope: str, limit_usd: float, spent_usd: float, reserved_usd: float, amount_usd: float
    ) -> None:
        # Spend and the request's own estimate: the first request of a task whose estimate alone is
        # over the limit read "budget exceeded" with nothing spent, and no way to tell why.
        super().__init__(
            f"budget for {scope} has no room for this request: limit {_usd(limit_usd)}, spent "
            f"{_usd(spent_usd)}, held by requests in flight {_usd(reserved_usd)}, this request would hold "
            f"{_usd(amount_usd)} (its cost with a long reply, and the fees of any hosted tools it declares)",
            code="budget_exceeded",
        )
        self.scope = scope
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self.reserved_usd = reserved_usd
        self.amount_usd = amount_usd


def _usd(value: float) -> str:
    """$1.25, $0.0042, $0.000012, $0: the digits a small amount needs (``.4f`` made it $0.0000)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"${text}" if text != "0" or value == 0 else "<$0.000001"


class StateUnavailable(ServiceUnavailable):
    """The shared state store cannot answer, and this operation fails closed (budgets).

    The client-facing message is generic; ``reason`` (for logs) says what failed.
    """

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(
            f"{what} unavailable: the shared state store (Redis) is unreachable", code="state_unavailable"
        )
        self.reason = reason
