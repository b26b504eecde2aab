"""The one place that retries and falls back.

Backends are tried in the decision's order. A failure moves on to the next backend only when
it is the kind another backend may not share (connect errors, timeouts, 429, 5xx, a missing
key) and only before the client has received any content: for streams the commit point is
the first content event, and everything read before it is held back until then. One overall
deadline bounds the whole request; each phase's timeout names itself in the error it raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from router import sse
from router.catalog import Backend, Catalog
from router.errors import RouterError, UpstreamError, UpstreamTimeout
from router.policy.decide import Decision
from router.protocols import WIRES, ClientRequest, StreamObserver
from router.settings import Timeouts
from router.timing import Phases
from router.upstream import Upstream

_FAILURE_EVENTS = frozenset({"error", "response.failed"})


@dataclass(slots=True)
class Attempt:
    model: str
    ms: float
    status: int | None = None
    error_type: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ms": round(self.ms, 3),
            "status": self.status,
            "error_type": self.error_type,
        }


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
    tries: list[Attempt] = field(default_factory=list)
    backend: Backend | None = None


class Executor:
    def __init__(self, upstream: Upstream, catalog: Catalog, timeouts: Timeouts) -> None:
        self.upstream = upstream
        self.timeouts = timeouts
        self.use(catalog)

    def use(self, catalog: Catalog) -> None:
        """Switch to a reloaded catalog; in-flight calls keep the slots they hold."""
        self.catalog = catalog
        self._slots = {b.id: asyncio.Semaphore(b.max_concurrency) for b in catalog if b.max_concurrency}

    async def complete(
        self, req: ClientRequest, decision: Decision, headers: dict[str, str], phases: Phases, ex: Execution
    ) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeouts.overall
        last: RouterError | None = None
        for model in decision.order:
            backend = ex.backend = self.catalog[model]
            slot = self._slots.get(model)
            try:
                async with asyncio.timeout_at(_loop_deadline(deadline)):
                    # Waiting for a concurrency slot is queue time: the upstream call starts after.
                    if slot is not None:
                        await slot.acquire()
                    try:
                        phases.start_upstream()
                        obj = await self.upstream.complete(req, backend, headers)
                    finally:
                        if slot is not None:
                            slot.release()
            except TimeoutError:
                last = UpstreamTimeout("overall", self.timeouts.overall)
            except RouterError as exc:
                last = exc
            else:
                phases.byte()
                ex.tries.append(Attempt(model, _ms(phases.upstream_start), 200))
                return obj
            ex.tries.append(Attempt(model, _ms(phases.upstream_start), last.status, last.kind))
            if not last.next_candidate or time.monotonic() >= deadline:
                break
        assert last is not None
        raise last

    async def open_stream(
        self, req: ClientRequest, decision: Decision, headers: dict[str, str], phases: Phases, ex: Execution
    ) -> CommittedStream:
        deadline = time.monotonic() + self.timeouts.overall
        last: RouterError | None = None
        wire = WIRES[req.protocol]
        for model in decision.order:
            backend = ex.backend = self.catalog[model]
            slot = self._slots.get(model)
            if slot is not None:
                try:
                    async with asyncio.timeout_at(_loop_deadline(deadline)):
                        await slot.acquire()
                except TimeoutError:
                    last = UpstreamTimeout("overall", self.timeouts.overall)
                    break
            phases.start_upstream()
            first_token_by = min(deadline, time.monotonic() + self.timeouts.first_token)
            which = "first_token" if first_token_by < deadline else "overall"
            try:
                async with asyncio.timeout_at(_loop_deadline(first_token_by)):
                    events = await self.upstream.open_stream(req, backend, headers)
                    committed = await _until_content(events, wire.observer(), phases, backend)
            except BaseException as exc:
                if slot is not None:
                    slot.release()
                if isinstance(exc, TimeoutError):
                    seconds = self.timeouts.first_token if which == "first_token" else self.timeouts.overall
                    last = UpstreamTimeout(which, seconds)
                elif isinstance(exc, RouterError):
                    last = exc
                else:
                    raise
            else:
                if slot is not None:
                    committed.release = slot.release
                ex.tries.append(Attempt(model, _ms(phases.upstream_start), 200))
                return committed
            ex.tries.append(Attempt(model, _ms(phases.upstream_start), last.status, last.kind))
            if not last.next_candidate or time.monotonic() >= deadline:
                break
        assert last is not None
        raise last


async def _until_content(
    events: AsyncIterator[sse.Event], observer: StreamObserver, phases: Phases, backend: Backend
) -> CommittedStream:
    held: list[sse.Event] = []
    try:
        async for ev in events:
            phases.byte()
            if ev.name in _FAILURE_EVENTS or ev.data.startswith(b'{"error"'):
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


def _ms(start: float | None) -> float:
    return 0.0 if start is None else (time.perf_counter() - start) * 1000


def _loop_deadline(monotonic_deadline: float) -> float:
    """asyncio deadlines are on the loop's clock; convert from time.monotonic()."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())
