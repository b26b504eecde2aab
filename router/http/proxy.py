"""One proxied request, end to end: parse → task → features → decide → execute → answer → log.

Whatever happens, exactly one log record is submitted per request — bad input and failures
included — and the client gets either the backend's reply or an error in its own protocol's
shape. Logging happens off the request path (the writer batches in the background).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.errors import PayloadTooLarge, RouterError, UpstreamError
from router.features import request as features
from router.features.promptsize import INLINE_CHARS, PromptSize
from router.features.task import context as taskcontext
from router.features.task import identity as tasks
from router.features.task.tracker import TaskState
from router.forward import accounting
from router.forward.execute import CommittedStream, Execution
from router.http import admission
from router.http.auth import presented_key
from router.ids import IdMaker
from router.policy.decide import Decision
from router.policy.scopes import scope_facts
from router.protocols import OPENAI_CHAT, WIRES, ClientRequest, Usage, Wire, sse
from router.protocols.openai_chat import is_usage_only, usage_frame_with_cost
from router.state import Reservation
from router.store.records import RequestRecord
from router.telemetry import console
from router.telemetry.phases import Phases

if TYPE_CHECKING:
    from router.app.factory import Services

log = logging.getLogger("router.http.proxy")

#: Request headers never shown to rules, never logged.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def rule_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in SECRET_HEADERS}


def header_dict(request: Request) -> dict[str, str]:
    """The request's headers, read once: Starlette's ``Headers`` scans the list per lookup."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}


class Proxy:
    def __init__(self, services: Services) -> None:
        self.s = services
        self._new_id = IdMaker()

    async def handle(self, request: Request, protocol: str) -> Response:
        phases = Phases()
        rec = RequestRecord(request_id=self._new_id(), ts=time.time(), protocol=protocol)
        self.s.telemetry.started(rec)
        rec.endpoint = request.scope["path"]
        all_headers = header_dict(request)
        rec.client = (all_headers.get("user-agent") or "")[:64] or None
        task = _Task()
        try:
            response = await self._respond(request, all_headers, WIRES[protocol], phases, rec, task)
        except BaseException:
            self._close(rec, phases, task)
            raise
        if isinstance(response, _Reply):
            if self.s.settings.durable_log:
                # The record is stored before the client hears anything (a store that fails
                # keeps it buffered and retried, and /readyz says so; the reply still goes out).
                self._close(rec, phases, task)
                with contextlib.suppress(Exception):
                    await self.s.writer.flush()
            else:
                # Accounted once the reply is out: the client does not wait for metrics and the log.
                response.then = partial(self._close, rec, phases, task)
        return response

    async def _respond(
        self, request: Request, all_headers: dict[str, str], wire: Wire, phases: Phases, rec: RequestRecord,
        task: _Task,
    ) -> Response:  # fmt: skip
        """The reply: a stream (which accounts for itself when it ends) or a whole ``_Reply``."""
        try:
            principal = await self.s.auth.check(request)
            rec.key_id = principal.key_id
            raw = await read_body(request, self.s.settings.max_body_bytes)
            req = wire.parse(raw)
            rec.requested_model = req.model
            principal.authorize_model(req.model)
            headers = rule_headers(all_headers)
            decision, task.state = await self.decide(req, all_headers, headers, rec, len(raw), task)
            task.held = await admission.admit(self.s, principal, rec, decision)
            phases.decide()
            ex = Execution()
            try:
                if req.stream:
                    committed = await self.s.executor.open_stream(req, decision, headers, phases, ex)
                else:
                    reply = await self.s.executor.complete(req, decision, headers, phases, ex)
            finally:
                _record_tries(rec, ex, phases)  # failed streams too: their tries and backend are logged
            if req.stream:
                return self._stream(wire, req, committed, phases, rec, task)
            self._account(rec, wire.usage_from(reply.obj), 0)
            rec.status = 200
            return _Reply(reply.body(), media_type="application/json", headers=_route_headers(rec))
        except RouterError as err:
            return self._error(wire, err, rec)
        except ClientDisconnect:
            rec.status, rec.error_type = 499, "client_disconnected"
            return _Reply(status_code=499)
        except Exception:
            log.exception("unexpected failure in request %s", rec.request_id)
            return self._error(wire, RouterError("internal error in the router"), rec)

    async def decide(
        self, req: ClientRequest, all_headers: dict[str, str], headers: dict[str, str], rec: RequestRecord,
        body_bytes: int, task: _Task,
    ) -> tuple[Decision, TaskState]:  # fmt: skip
        """``all_headers``: the request's; ``headers``: those rules may read (no secrets); ``body_bytes``:
        the raw body's size, the memory the conversation memo charges for it."""
        key_hash = tasks.client_key_hash(presented_key(all_headers))
        rec.task_id = tasks.scoped(
            rec.key_id, tasks.task_id(req, all_headers.get("x-router-task-id"), key_hash)
        )
        rec.stream = req.stream
        rec.temperature, rec.top_p = req.temperature, req.top_p
        rec.max_tokens = req.max_output_tokens
        rec.reasoning_effort, rec.thinking_budget = req.reasoning_effort, req.thinking_budget
        rec.tools_sha256, rec.system_sha256 = req.tools_sha256(), req.system_sha256()
        rec.n_messages, rec.n_tools = len(req.messages), len(req.tools)
        if self.s.settings.log_prompts:
            rec.prompt = orjson.dumps({"system": req.system, "messages": req.messages}).decode()
        size = self.s.sizer.measure(req, rec.task_id, body_bytes)
        feats = features.of(req, size.tokens, headers)
        state = await taskcontext.enter(
            self.s, req, feats, rec, all_headers.get("x-router-attempt"), size.repeat, size.facts
        )
        runtime = self.s.runtime
        facts = scope_facts(req, headers, rec.key_id) if runtime.scopes else None
        rec.arm, decider = runtime.arm_for(rec.task_id, facts)
        counted = not size.settled and decider.size_matters(feats, size.low, size.high)
        self.s.telemetry.prompt_sized(size.remembered > 0, counted)
        if not size.settled:
            if counted:
                feats.prompt_tokens = self.s.sizer.settle(size)  # a hard limit is never decided on a guess
            elif size.pending_chars <= INLINE_CHARS:
                # Counted once the reply is out (``_close``), not while the client waits.
                task.unsettled = size
            else:
                self.s.tasks.spawn_blocking(self.s.sizer.settle, size, name="count-tokens")
        rec.prompt_tokens_est = feats.prompt_tokens
        decision = decider.decide(feats)
        rec.policy_revision = runtime.revision
        logged = runtime.logged_headers
        if logged:
            rec.rule_headers = {h: v for h in logged if (v := headers.get(h)) is not None}
        rec.decision_id = decision.decision_id
        rec.policy = decision.policy
        rec.decision_reason = decision.reason
        rec.propensity = decision.propensity
        rec.candidates = [e.as_dict() for e in decision.candidates]
        rec.chosen_model = decision.chosen
        est = decision.estimate(decision.chosen)
        rec.cost_est_usd = est.cost_usd if est else None
        return decision, state

    def _stream(
        self, wire: Wire, req: ClientRequest, c: CommittedStream, phases: Phases, rec: RequestRecord,
        task: _Task,
    ) -> _Stream:  # fmt: skip
        chat = req.protocol == OPENAI_CHAT
        hide_usage = chat and not req.include_usage
        rec.status = 200
        content_events = 1
        started = finished = False

        def finalize() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            c.release()
            self._account(rec, c.observer.usage, content_events)
            self._close(rec, phases, task)

        async def abandoned() -> None:
            # The client left before the body began: close the upstream and account anyway.
            if not started:
                rec.status, rec.error_type = 499, "client_disconnected"
                await c.rest.aclose()  # type: ignore[attr-defined]
            finalize()

        async def body() -> AsyncGenerator[bytes, None]:
            nonlocal content_events, started
            started = True
            pending: list[bytes] = []
            try:
                yield b"".join(ev.raw for ev in c.held if not (hide_usage and is_usage_only(ev.data)))
                # Events that arrived in one network read go out in one write: each send through
                # the ASGI stack costs more than the bytes it carries.
                async for ev in c.rest:
                    phases.byte()
                    if c.observer.observe(ev.name, ev.data):
                        phases.token()
                        content_events += 1
                    if not (chat and is_usage_only(ev.data)):
                        pending.append(ev.raw)
                    elif not hide_usage:
                        cost = accounting.cost_split(c.backend.price, c.observer.usage).total
                        pending.append(usage_frame_with_cost(ev.data, cost))
                    if not ev.more and pending:
                        yield b"".join(pending)
                        pending.clear()
                if pending:
                    yield b"".join(pending)
                if not c.observer.done:
                    raise UpstreamError(f"backend {c.backend.id!r} ended the stream before its final event")
            except RouterError as err:
                # After the commit point a failure is one protocol error event, then the end.
                rec.error_type, rec.error_message = err.kind, err.message
                yield b"".join(pending) + wire.error_frame(err)
            except BaseException:
                # One rule, streamed or not: a client that left is a 499 (nginx's "client closed"),
                # unless it had the whole stream (clients hang up as soon as they see the end).
                if rec.error_type is None and not c.observer.done:
                    rec.status, rec.error_type = 499, "client_disconnected"
                raise
            finally:
                await sse.close_quietly(c.rest)  # the upstream stops now, not when collected
                finalize()

        return _Stream(body(), abandoned, media_type="text/event-stream", headers=_route_headers(rec))

    def _account(self, rec: RequestRecord, usage: Usage, content_events: int) -> None:
        if rec.chosen_model is None:
            return
        backend = self.s.catalog[rec.chosen_model]
        rec.backend_model = backend.litellm_model
        rec.usage_estimated = accounting.fill_missing(usage, rec.prompt_tokens_est or 0, content_events)
        rec.provider_model = usage.provider_model
        rec.response_id, rec.finish_reasons = usage.response_id, usage.finish_reasons or None
        rec.input_tokens, rec.output_tokens = usage.input_tokens, usage.output_tokens
        rec.cache_read_tokens, rec.cache_write_tokens = usage.cache_read_tokens, usage.cache_write_tokens
        rec.reasoning_tokens = usage.reasoning_tokens
        split = accounting.cost_split(backend.price, usage)
        rec.cost_usd = split.total
        rec.cost_input_usd, rec.cost_output_usd = split.input, split.output
        rec.cost_cache_read_usd, rec.cost_cache_write_usd = split.cache_read, split.cache_write

    def _error(self, wire: Wire, err: RouterError, rec: RequestRecord) -> _Reply:
        rec.status, rec.error_type, rec.error_message = err.status, err.kind, err.message[:500]
        headers = _route_headers(rec)
        retry_after = getattr(err, "retry_after", None)
        if retry_after is not None:
            headers["retry-after"] = str(int(retry_after + 0.999))
        return _Reply(orjson.dumps(wire.error_body(err)), err.status, headers, "application/json")

    def _close(self, rec: RequestRecord, phases: Phases, task: _Task) -> None:
        """Account for a request that has ended, however it ended: exactly once."""
        if task.closed:
            return
        task.closed = True
        phases.finish()
        if task.unsettled is not None:
            self.s.sizer.settle(task.unsettled)
        if task.state is not None:
            taskcontext.served(self.s, task.state, rec)
        if task.held is not None:
            self.s.tasks.spawn(admission.settle(self.s, task.held, rec.cost_usd), name="settle-budget")
        for name, value in phases.summary().items():
            setattr(rec, name, value)
        self.s.writer.submit(rec)
        self.s.telemetry.finished(rec, phases)
        console.log_request(rec)


@dataclass(slots=True)
class _Task:
    """What a request holds in its task until it is accounted for."""

    state: TaskState | None = None
    held: Reservation | None = None
    #: A short prompt part left to count exactly (for the conversation's next turn) after the reply.
    unsettled: PromptSize | None = None
    closed: bool = False


class _Reply(Response):
    """A whole reply; ``then`` runs once it has been sent, or failed to be."""

    then: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.then is not None:
                self.then()


def _record_tries(rec: RequestRecord, ex: Execution, phases: Phases) -> None:
    rec.tries = [t.as_dict(phases.arrival) for t in ex.tries]
    if ex.backend is not None:
        # Known before the call: a request that failed keeps the backend it failed on.
        rec.chosen_model, rec.backend_model = ex.backend.id, ex.backend.litellm_model


def _route_headers(rec: RequestRecord) -> dict[str, str]:
    h = {"x-request-id": rec.request_id}
    if rec.cost_usd is not None:  # known before the headers only for a whole reply
        h["x-router-cost-usd"] = f"{rec.cost_usd:.10f}".rstrip("0").rstrip(".")
    if rec.chosen_model:
        h["x-router-model"] = rec.chosen_model
    if rec.decision_id:
        h["x-router-decision-id"] = rec.decision_id
    if rec.task_id:
        h["x-router-task-id"] = rec.task_id
    return h


class _Stream(Response):
    """A streamed reply, sent as raw ASGI messages, accounted for however it ends.

    Starlette's StreamingResponse watches for the client leaving with an anyio task group per
    response, which cost more CPU than relaying the 20 events of a typical stream. Here one
    waiting ``receive()`` does the watching and cancels the sender when the client goes.
    """

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        on_close: Callable[[], Awaitable[None]],
        media_type: str,
        headers: Mapping[str, str],
    ) -> None:
        self.body_iterator = content
        self._on_close = on_close
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sender = asyncio.current_task()
        finished = False

        def client_left(watch: asyncio.Future[Any]) -> None:
            if not finished and not watch.cancelled() and sender is not None:
                sender.cancel()

        watch = asyncio.ensure_future(_disconnected(receive))
        watch.add_done_callback(client_left)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            # Cancelled because the client left: that ends this response, not the server.
            if not watch.done() or watch.cancelled():
                raise
            if sender is not None:
                sender.uncancel()
        except OSError:
            pass  # the connection broke under a write: the client is gone too
        finally:
            finished = True
            watch.remove_done_callback(client_left)
            watch.cancel()
            await self.body_iterator.aclose()
            await self._on_close()


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
