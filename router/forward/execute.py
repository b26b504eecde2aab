"""The one place that retries and falls back.

Backends are tried in the decision's order, within one overall deadline:

* a failure moves on to the next backend only when another backend may not share it (connect
  errors, timeouts, 429, 5xx, a missing key, a request its translation cannot carry); a request
  the backend rejected (400/401/403/404/422) is returned as it is, not retried. A request no
  candidate could translate is the client's 400 only when every candidate failed so;
* a context-length error moves on only to backends with a larger window;
* a backend is retried (once, after a jittered pause or its ``Retry-After`` if that fits in the
  deadline) only when no other backend is left — moving on is faster for the agent — and only
  while the retry budget allows: retries are capped as a share of traffic, so an outage is not
  multiplied by the router;
* a breaker per backend (shared across replicas through ``router.shared``) skips backends that
  keep failing, with a half-open probe to notice their return. A failure the request itself may
  have caused — a whole reply, or the overall deadline, given up by a timeout while the backend
  may still be writing a reply the request made long — names the tenant: one tenant's such
  failures count once, so a key asking for huge replies cannot open a backend's breaker for all;
* for streams, all of this happens only before the first content event — the commit point.
  Everything read before it is held back until then. A stream is given up at the first-token
  timeout only for another backend: the last one standing is waited for to the overall deadline;
* in the seconds after a start while litellm still loads, the backends the client's protocol
  reaches directly go before those that need translating, and a translated call waits for the
  load as queue time, within the overall deadline but not the first-token one.

Every timeout error names the timeout that fired (connect, first_token, idle, overall).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from router.errors import (
    MissingCredentials,
    RouterError,
    ServiceUnavailable,
    Untranslatable,
    UpstreamError,
    UpstreamTimeout,
)
from router.forward.timeouts import Timeouts, gives_up_at_first_token
from router.forward.upstream import Reply, Upstream, relay_base
from router.policy.catalog import Backend, Catalog
from router.policy.decide import Decision
from router.protocols import WIRES, ClientRequest, StreamObserver, Usage, sse
from router.shared import Breakers
from router.store.records import TryRecord
from router.telemetry.phases import Phases

T = TypeVar("T")

_FAILURE_EVENTS = frozenset({"error", "response.failed"})


@dataclass(slots=True)
class Try:
    """One try, for the log's ``tries`` (``router.telemetry.tries`` reads them)."""

    model: str
    #: perf_counter readings: the upstream call's start and the try's end (its failure; for the try
    #: that served, the reply or a stream's commit). None: the call never started (the breaker
    #: skipped the backend, or the deadline passed while the try waited in the router). A try that
    #: failed on a missing key or in litellm's translation has a start: both fail inside the call.
    start: float | None
    end: float
    status: int | None = None
    error_type: str | None = None
    #: The router gave up on the call by a timeout while the backend worked on it: the provider
    #: bills what it had done (``accounting.given_up`` charges it; ``cost_usd`` then says what).
    billed: bool = False
    #: What the provider reported billing for the call that failed (a Responses ``response.failed``
    #: carries its usage): charged as reported.
    usage: Usage | None = None
    cost_usd: float | None = None

    def record(self, arrival: float) -> TryRecord:
        """``arrival``: the request's arrival on the same clock; ``start_ms`` counts from it."""
        return TryRecord(
            self.model,
            start_ms=None if self.start is None else round((self.start - arrival) * 1000, 3),
            ms=None if self.start is None else round((self.end - self.start) * 1000, 3),
            status=self.status,
            error_type=self.error_type,
            cost_usd=self.cost_usd,
        )


@dataclass(slots=True)
class CommittedStream:
    """A stream that has produced content: the client may now be answered."""

    backend: Backend
    observer: StreamObserver
    held: list[sse.Event]
    rest: AsyncIterator[sse.Event]
    #: Frees the backend's concurrency slot; called once the stream has ended.
    release: Callable[[], None] = lambda: None


@dataclass(slots=True)
class Execution:
    tries: list[Try] = field(default_factory=list)
    backend: Backend | None = None
    #: Retries on the same backend, for the tests: the log counts them from ``tries`` (``tries.retried``).
    retries: int = 0
    #: Called before a try that follows tries the provider bills without their serving (given up
    #: by a timeout, or failed with their usage reported), with the tries so far: the budgets
    #: hold what those cost before another try spends more. It raises (a budget's refusal) to stop.
    hold_billed: Callable[[list[Try]], Awaitable[object]] | None = None
    #: Called before a streamed try, with the tries so far and this one as if given up: whether the
    #: budgets hold what giving it up would cost beside the next try (held now if they can). When
    #: they cannot, the try is waited for past the first-token timeout, to the overall deadline
    #: (``patient``): given up, it was billed and the next try refused, the request paying for none.
    may_give_up: Callable[[list[Try]], Awaitable[bool]] | None = None
    #: The try in progress is not given up at the first-token timeout: no other backend may follow
    #: it (``gives_up_at_first_token``), or the budgets cannot (``may_give_up``).
    patient: bool = False
    #: Who sent the request (a key id, else the master key's or open mode's name): the breakers
    #: count a failure the request may have caused against it (``_suspect``).
    tenant: str | None = None


class Turn(NamedTuple):
    """A try's turn at its backend (``Executor._wait_turn``)."""

    #: The backend's concurrency slot taken, if it has a limit: the call releases it when done.
    slot: asyncio.Semaphore | None
    #: Whether the try waited inside the router for its turn (for the slot or litellm's load):
    #: its overall deadline is then partly the router's.
    queued: bool

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()


class RetryBudget:
    """Retries allowed as a share of requests: each request earns ``ratio`` of a retry, up to a cap."""

    def __init__(self, ratio: float = 0.2, cap: float = 20.0) -> None:
        self.ratio, self.cap = ratio, cap
        self._balance = cap

    def earn(self) -> None:
        self._balance = min(self.cap, self._balance + self.ratio)

    def spend(self) -> bool:
        if self._balance >= 1.0:
            self._balance -= 1.0
            return True
        return False


class Executor:
    def __init__(
        self,
        upstream: Upstream,
        catalog: Catalog,
        timeouts: Timeouts,
        breakers: Breakers,
        retry_budget: RetryBudget | None = None,
        backoff_s: float = 0.25,
    ) -> None:
        self.upstream = upstream
        self.timeouts = timeouts
        self.breakers = breakers
        self.retry_budget = retry_budget or RetryBudget()
        self.backoff_s = backoff_s
        self.use(catalog)

    def use(self, catalog: Catalog) -> None:
        """Size the concurrency slots for a reloaded catalog; in-flight calls keep the slots they hold
        (and the catalog of the runtime their request was admitted with)."""
        self._slots = {b.id: asyncio.Semaphore(b.max_concurrency) for b in catalog if b.max_concurrency}

    async def complete(
        self, req: ClientRequest, decision: Decision, catalog: Catalog, headers: dict[str, str], phases: Phases,
        ex: Execution,
    ) -> Reply:  # fmt: skip
        async def call(backend: Backend, deadline: float, turn: Turn) -> Reply:
            try:
                async with asyncio.timeout_at(_loop_deadline(deadline)):
                    phases.start_upstream()
                    reply = await self.upstream.complete(req, backend, headers, _prompt(decision, backend))
            finally:
                turn.release()
            phases.byte()
            return reply

        return await self._run(decision, catalog, phases, ex, call, req.protocol, streamed=False)

    async def open_stream(
        self, req: ClientRequest, decision: Decision, catalog: Catalog, headers: dict[str, str], phases: Phases,
        ex: Execution,
    ) -> CommittedStream:  # fmt: skip
        wire = WIRES[req.protocol]

        async def call(backend: Backend, deadline: float, turn: Turn) -> CommittedStream:
            phases.start_upstream()
            first_token_by = (
                deadline if ex.patient else min(deadline, time.monotonic() + self.timeouts.first_token)
            )
            observer = wire.observer()
            try:
                async with asyncio.timeout_at(_loop_deadline(first_token_by)):
                    events = await self.upstream.open_stream(
                        req, backend, headers, _prompt(decision, backend)
                    )
                    committed = await _until_content(events, observer, phases, backend)
            except BaseException as exc:
                turn.release()
                failed = exc
                if isinstance(exc, TimeoutError):
                    if first_token_by < deadline:
                        failed = UpstreamTimeout("first_token", self.timeouts.first_token)
                    else:
                        failed = UpstreamTimeout("overall", self.timeouts.overall)
                if isinstance(failed, UpstreamError) and observer.usage.output_tokens is not None:
                    failed.usage = observer.usage  # a final report, not message_start's
                if failed is exc:
                    raise
                raise failed from None
            if turn.slot is not None:
                committed.release = turn.slot.release
            return committed

        return await self._run(decision, catalog, phases, ex, call, req.protocol, streamed=True)

    async def _wait_turn(self, backend: Backend, protocol: str) -> Turn:
        """Wait for the backend's concurrency slot, then, for a call that needs translating, for
        litellm's load (a dict lookup once loaded). The turn says whether either made the try wait,
        and holds the slot taken, for the call to release."""
        slot = self._slots.get(backend.id)
        loading = not self.upstream.translation_ready and relay_base(backend, protocol) is None
        queued = loading or (slot is not None and slot.locked())
        if slot is not None:
            await slot.acquire()
        try:
            if loading:
                await self.upstream.prepare_translation()
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        return Turn(slot, queued)

    async def _run(
        self,
        decision: Decision,
        catalog: Catalog,
        phases: Phases,
        ex: Execution,
        call: Callable[[Backend, float, Turn], Awaitable[T]],
        protocol: str,
        *,
        streamed: bool,
    ) -> T:
        self.retry_budget.earn()
        deadline = time.monotonic() + self.timeouts.overall
        order = list(decision.order)
        if not self.upstream.translation_ready:
            # litellm loads for seconds (tens under load) after a start: a candidate the client's
            # protocol reaches directly answers now, one that needs translating only after the load.
            relayed = [m for m in order if relay_base(catalog[m], protocol) is not None]
            if relayed and relayed != order[: len(relayed)]:
                order = relayed + [m for m in order if m not in relayed]
        last: RouterError | None = None
        #: The latest failure of a backend's own, beside a request some backend could not take.
        own: RouterError | None = None
        skipped: list[str] = []
        i = 0
        while i < len(order):
            backend = ex.backend = catalog[order[i]]
            i += 1
            if not await self.breakers.before_call(backend.id):
                skipped.append(backend.id)
                ex.tries.append(Try(backend.id, None, time.perf_counter(), None, "BreakerOpen"))
                continue
            for retry in (False, True):
                if ex.hold_billed is not None and any(t.billed or t.usage is not None for t in ex.tries):
                    await ex.hold_billed(ex.tries)
                if streamed:
                    ex.patient = not gives_up_at_first_token(backend.id, order[i:]) or (
                        ex.may_give_up is not None
                        and not await ex.may_give_up([*ex.tries, Try(backend.id, 0.0, 0.0, billed=True)])
                    )
                began, queued = time.perf_counter(), False
                try:
                    # Waiting for the turn is queue time, within the overall deadline: the call starts after.
                    async with asyncio.timeout_at(_loop_deadline(deadline)):
                        turn = await self._wait_turn(backend, protocol)
                    queued = turn.queued
                    result = await call(backend, deadline, turn)
                except TimeoutError:
                    last = UpstreamTimeout("overall", self.timeouts.overall)
                except RouterError as exc:
                    last = exc
                    if not isinstance(exc, Untranslatable):
                        own = exc
                else:
                    ex.tries.append(_try(backend, phases, began, 200))
                    await self.breakers.record_success(backend.id)
                    return result
                # The backend's own status when it answered; else the router's (502 unreachable, 504 ...).
                status = getattr(last, "upstream_status", None) or last.status
                t = _try(backend, phases, began, status, last.kind)
                t.usage = _reported(last)
                t.billed = (
                    t.start is not None and isinstance(last, UpstreamTimeout) and last.which != "connect"
                )
                ex.tries.append(t)
                await self.breakers.record_failure(
                    backend.id,
                    last.retryable and not _queue_spent(last, t, queued),
                    caused_by=ex.tenant if _suspect(last, streamed) else None,
                )
                remaining = deadline - time.monotonic()
                if retry or not last.retryable or i < len(order) or remaining <= 0:
                    break
                # The last backend standing: one retry, if the budget and the deadline allow.
                pause = _pause(last, self.backoff_s)
                if pause is None or pause >= remaining or not self.retry_budget.spend():
                    break
                ex.retries += 1
                await asyncio.sleep(pause)
            assert last is not None
            if last.code == "context_length_exceeded":
                # Only a larger window can help; the decision's estimate was too low for this one.
                window = backend.context_window
                order = order[:i] + [m for m in order[i:] if catalog[m].context_window > window]
                continue
            if not last.next_candidate or time.monotonic() >= deadline:
                break
        if last is None:
            raise ServiceUnavailable(
                f"every candidate backend is failing and paused by its breaker: {', '.join(skipped)}"
            )
        if isinstance(last, MissingCredentials) and len(ex.tries) > 1:
            raise _all_keys_missing(ex.tries, catalog) or last
        if isinstance(last, Untranslatable) and (own is not None or skipped):
            # The request is the client's to fix only when no candidate could take it; here one
            # failed for its own reasons or was paused, and may serve it once it recovers.
            raise own or ServiceUnavailable(
                f"candidate backends are failing and paused by their breakers: {', '.join(skipped)}; "
                f"the others cannot take this request ({last.message})"
            )
        raise last


def _reported(err: RouterError) -> Usage | None:
    """What the provider reported billing for the call that failed with ``err``."""
    usage = err.usage if isinstance(err, UpstreamError) else None
    return usage if isinstance(usage, Usage) else None


def _all_keys_missing(tries: list[Try], catalog: Catalog) -> MissingCredentials | None:
    """One error naming every key variable, where each backend tried lacked its own: said one at
    a time, an operator who sets the variable named meets the next."""
    if any(t.error_type != MissingCredentials.__name__ for t in tries):
        return None
    missing: dict[str, list[str]] = {}
    for t in tries:
        missing.setdefault(str(catalog[t.model].api_key_env), []).append(t.model)
    named = ", ".join(f"{var} ({', '.join(ids)})" for var, ids in missing.items())
    return MissingCredentials(f"no backend could be called, their key variables are not set: {named}")


def _prompt(decision: Decision, backend: Backend) -> int | None:
    """The decision's estimate of the prompt in ``backend``'s tokens (None for a backend it did not weigh)."""
    estimate = decision.estimate(backend.id)
    return None if estimate is None else estimate.prompt_tokens


def _queue_spent(err: RouterError, t: Try, queued: bool) -> bool:
    """Whether the router's own queue, not the backend, spent the try's overall deadline: the
    deadline passed while the try waited for its turn (the backend's concurrency slot or
    litellm's load), so its call never started (``t.start`` is None: the only router error that
    ends a try before its call), or it passed at the backend after such a wait (``queued``) had
    used part of it. Such a failure says nothing of the backend: the breaker takes it as an answer
    (a half-open probe's slot is freed).

    Not a missing key or a failed translation: both never reach the backend either, but fail
    inside the call (``Upstream`` reads the key and translates there), so ``t.start`` is set and
    this is False; neither is retryable, so the breaker takes them as an answer all the same."""
    if t.start is None:
        return True
    return queued and isinstance(err, UpstreamTimeout) and err.which == "overall"


def _suspect(err: RouterError, streamed: bool) -> bool:
    """Whether the request may have caused ``err`` rather than the backend: a timeout that gave up
    on a whole reply (nothing of it comes before it is done, so a reply the request made long, by
    its ``max_tokens`` or its task, looks like a hung backend), or on the request's overall
    deadline. A stream's first content that comes later than ``first_token`` (or its silence for
    ``idle``), connect errors and the backend's own failing statuses are the backend's."""
    if not isinstance(err, UpstreamTimeout):
        return False
    return err.which == "overall" or (not streamed and err.which == "idle")


def _pause(err: RouterError, base: float) -> float | None:
    """Seconds to wait before retrying: the provider's Retry-After, else jittered backoff."""
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        return float(retry_after)
    return base * (0.5 + random.random())


async def _until_content(
    events: AsyncIterator[sse.Event], observer: StreamObserver, phases: Phases, backend: Backend
) -> CommittedStream:
    held: list[sse.Event] = []
    try:
        async for ev in events:
            phases.byte()
            if ev.name in _FAILURE_EVENTS or ev.data.startswith(b'{"error"'):
                observer.observe(ev.name, ev.data)  # a response.failed says what it billed
                raise UpstreamError(f"backend {backend.id!r} failed before its first token")
            held.append(ev)
            if observer.observe(ev.name, ev.data):
                phases.token()
                break
    except BaseException:
        # Timeouts and failures before the commit point must not leave the connection open.
        await events.aclose()  # type: ignore[attr-defined]
        raise
    return CommittedStream(backend, observer, held, events)


def _try(backend: Backend, phases: Phases, began: float, status: int | None, kind: str | None = None) -> Try:
    """The try that began at ``began``: its upstream call started then if ``phases`` saw a start since."""
    started = phases.upstream_start
    reached = started is not None and started >= began
    return Try(backend.id, started if reached else None, time.perf_counter(), status, kind)


def _loop_deadline(monotonic_deadline: float) -> float:
    """asyncio deadlines are on the loop's clock; convert from time.monotonic()."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())
