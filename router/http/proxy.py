"""One proxied request, end to end: parse → task → features → decide → admit → execute → answer → log.

Whatever happens, exactly one log record is submitted per request — bad input and failures
included — and the client gets either the backend's reply or an error in its own protocol's
shape. Logging happens off the request path (the writer batches in the background).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from functools import partial

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from router.errors import (
    AttemptStopped,
    PayloadTooLarge,
    RateLimited,
    RouterError,
    UnknownModel,
    UpstreamError,
    redact_key,
)
from router.features.task.identity import client_key_hash, scoped, task_id_of
from router.forward.accounting import (
    CostSplit,
    charge,
    cost_split,
    given_up,
    hidden_output,
    streamed_tokens,
    unserved_cost,
    written_tokens,
)
from router.forward.execute import CommittedStream, Execution, Executor, Try
from router.http.admission import Admission
from router.http.auth import Auth, Principal, presented_key
from router.http.flight import Flight, prompt_text
from router.http.recorder import Recorder
from router.http.replies import error_reply
from router.http.responses import StreamedReply, WholeReply
from router.ids import IdMaker
from router.policy.active import ActivePolicyHolder
from router.policy.catalog import Backend
from router.policy.pipeline import Decided, Pipeline
from router.protocols import OPENAI_CHAT, WIRES, ClientRequest, Usage, Wire, sse
from router.protocols.openai_chat import is_usage_only, usage_frame_with_cost
from router.shared import BudgetExceeded
from router.telemetry.phases import Phases

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
        if chunk:  # Starlette ends the stream with an empty chunk: a body of one is then not copied
            chunks.append(chunk)
    return b"".join(chunks)


def rule_headers(headers: Mapping[str, str], principal: Principal) -> dict[str, str]:
    """The headers rules, scopes and the log may read: no secrets, and the team the key sets."""
    return principal.own_team({k: v for k, v in headers.items() if k not in SECRET_HEADERS})


#: The master key has no format ``redact_key``'s patterns could find: sent as the model name, it
#: was kept in plain text in the log, the console line and the spans.
_MASTER_AS_MODEL = (
    "the model name is the router's master key (ROUTER_MASTER_KEY), not a model: GET /v1/models lists them"
)


def task_of(
    req: ClientRequest, key_id: str | None, all_headers: Mapping[str, str], secret: Callable[[str], bool]
) -> str:
    """The request's task, as stored for its caller (``identity.scoped``). A name that is a
    ``secret`` (the master key, which no pattern finds) is not one: as the task's name or its
    session, it was kept in the log, the console and the reply's ``x-router-task-id``."""
    key_hash = client_key_hash(presented_key(all_headers))
    named = all_headers.get("x-router-task-id")
    if req.session_hint is not None and secret(req.session_hint):
        req.session_hint = None
    return scoped(key_id, task_id_of(req, None if named is None or secret(named) else named, key_hash))


def header_dict(request: Request) -> dict[str, str]:
    """The request's headers, read once: Starlette's ``Headers`` scans the list per lookup."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}


class Proxy:
    def __init__(
        self,
        auth: Auth,
        pipeline: Pipeline,
        admission: Admission,
        executor: Executor,
        recorder: Recorder,
        runtime: ActivePolicyHolder,
        *,
        max_body_bytes: int,
        log_prompts: bool = False,
        durable_log: bool = False,
    ) -> None:
        self.auth = auth
        self.pipeline = pipeline
        self.admission = admission
        self.executor = executor
        self.recorder = recorder
        self.runtime = runtime
        self.max_body_bytes = max_body_bytes
        self.log_prompts = log_prompts
        self.durable_log = durable_log
        self._new_id = IdMaker()

    async def handle(self, request: Request, protocol: str) -> Response:
        phases = Phases()
        all_headers = header_dict(request)
        # The request's one snapshot of the runtime: a reload meanwhile never mixes two policies.
        f = Flight(
            self._new_id(), time.time(), protocol, request.scope["path"],
            (all_headers.get("user-agent") or "")[:64] or None, self.runtime.current,
        )  # fmt: skip
        self.recorder.started(f)
        try:
            response = await self._respond(request, all_headers, WIRES[protocol], phases, f)
        except BaseException:
            self.recorder.close(f, phases)
            raise
        if isinstance(response, WholeReply):
            if self.durable_log:
                await self.recorder.stored(f, phases)
            else:
                # Accounted once the reply is out: the client does not wait for metrics and the log.
                response.then = partial(self.recorder.close, f, phases)
        return response

    async def _respond(
        self, request: Request, all_headers: dict[str, str], wire: Wire, phases: Phases, f: Flight
    ) -> Response:
        """The reply: a stream (which accounts for itself when it ends) or a ``WholeReply``."""
        try:
            principal = await self.auth.check(request)
            f.key_id = principal.key_id
            raw = await read_body(request, self.max_body_bytes)
            req = await self.pipeline.parse(wire.parse, raw)
            if self.auth.is_master(req.model):  # refused before the flight keeps it for the log
                raise UnknownModel(_MASTER_AS_MODEL)
            f.req = req
            principal.authorize_model(req.model)
            if self.log_prompts:
                f.prompt = prompt_text(req)
            headers = rule_headers(all_headers, principal)
            f.task_id = task_of(req, principal.key_id, all_headers, self.auth.is_master)
            key_left = await self.admission.key_budget_left(principal)
            f.decided = decided = await self.pipeline.decide(
                f.rt, req, f.task_id, f.key_id, headers, all_headers.get("x-router-attempt"), len(raw),
                key_left,
            )  # fmt: skip
            self.recorder.decided(decided)
            decision = decided.decision
            task_budget = f.rt.policy.spec.objective.max_cost_per_task
            f.rate_tokens = await self.admission.limit_rate(principal, decision)
            f.held = await self.admission.hold(principal, f.task_id, decision, task_budget)
            if f.held is not None:
                self.recorder.holding(f)
            phases.decide()
            f.execution = ex = Execution(tenant=principal.key_id or principal.name)
            if f.held is not None:
                ex.hold_billed = partial(self._hold_billed, f, principal, task_budget)
                ex.may_give_up = partial(self._hold_billed, f, principal, task_budget, refuse=False)
            if req.stream:
                committed = await self.executor.open_stream(req, decision, f.rt.catalog, headers, phases, ex)
                return self._stream(wire, req, committed, phases, f)
            reply = await self.executor.complete(req, decision, f.rt.catalog, headers, phases, ex)
            usage = wire.usage_from(reply.obj)
            self._charge(f, usage, 0 if usage.output_tokens else written_tokens(reply.obj))
            f.ended(200)
            return WholeReply(reply.body(), media_type="application/json", headers=_route_headers(f))
        except RouterError as err:
            return self._error(wire, err, f)
        except ClientDisconnect:
            f.ended(499, "client_disconnected")
            return WholeReply(status_code=499)
        except Exception:
            log.exception("unexpected failure in request %s", f.request_id)
            return self._error(wire, RouterError("internal error in the router"), f)

    async def preview(
        self, req: ClientRequest, principal: Principal, all_headers: dict[str, str], body_bytes: int
    ) -> Decided:
        """The decision this request would get now, without calling any backend or remembering it."""
        key_id = principal.key_id
        return await self.pipeline.preview(
            self.runtime.current, req, task_of(req, key_id, all_headers, self.auth.is_master), key_id,
            rule_headers(all_headers, principal), all_headers.get("x-router-attempt"), body_bytes,
            await self.admission.key_budget_left(principal),
        )  # fmt: skip

    def _stream(
        self, wire: Wire, req: ClientRequest, c: CommittedStream, phases: Phases, f: Flight
    ) -> StreamedReply:
        chat = req.protocol == OPENAI_CHAT
        hide_usage = chat and not req.include_usage
        # The tries given up before this one were billed too: usage.cost says what the request
        # cost, as a whole reply's x-router-cost-usd and the log do (it said the last call's).
        before = self._unserved(f, f.execution.tries if f.execution is not None else [])
        f.ended(200)
        content_events = 1
        started = finished = False

        def finalize() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            c.release()
            usage = c.observer.usage
            # Tokenized only when the provider's count is missing (a stream cut short).
            shown = (
                content_events
                if usage.output_tokens
                else max(content_events, streamed_tokens(c.observer.written))
            )
            self._charge(f, usage, shown)
            self.recorder.close(f, phases)

        async def abandoned() -> None:
            # The client left before the body began: close the upstream and account anyway.
            if not started:
                f.ended(499, "client_disconnected")
                await c.rest.aclose()  # type: ignore[attr-defined]
            finalize()

        async def stored() -> None:
            """In durable mode, the record is stored before the client gets the final event."""
            if self.durable_log:
                finalize()
                await self.recorder.stored(f, phases)

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
                    if c.observer.error is not None:
                        # The backend's error event, relayed as it came but for the key it may
                        # echo (rare: the one event of a failed stream).
                        pending.append(_without_key(ev.raw, c.backend))
                    elif not (chat and is_usage_only(ev.data)):
                        pending.append(ev.raw)
                    elif not hide_usage:
                        cost = (cost_split(c.backend.price, c.observer.usage) + before).total
                        pending.append(usage_frame_with_cost(ev.data, cost))
                    if not ev.more and pending:
                        if c.observer.done:
                            await stored()
                        yield b"".join(pending)
                        pending.clear()
                if pending:
                    if c.observer.done:
                        await stored()
                    yield b"".join(pending)
                if not c.observer.done:
                    said = c.observer.error and redact_key(c.observer.error, c.backend.api_key())
                    raise UpstreamError(
                        f"backend {c.backend.id!r} "
                        + (
                            "ended the stream before its final event"
                            if said is None
                            else f"sent an error: {said}"
                        )
                    )
            except RouterError as err:
                # After the commit point a failure is one protocol error event, then the end: none
                # of ours when the backend's own has been relayed.
                f.ended(200, err.kind, err.message)
                yield b"".join(pending) + (wire.error_frame(err) if c.observer.error is None else b"")
            except BaseException:
                # One rule, streamed or not: a client that left is a 499 (nginx's "client closed"),
                # unless it had the whole stream (clients hang up as soon as they see the end).
                if f.error_type is None and not c.observer.done:
                    f.ended(499, "client_disconnected")
                raise
            finally:
                await sse.close_quietly(c.rest)  # the upstream stops now, not when collected
                finalize()

        return StreamedReply(body(), abandoned, media_type="text/event-stream", headers=_route_headers(f))

    @staticmethod
    def _charge(f: Flight, usage: Usage | None, output_est: int = 0) -> None:
        """What the request was billed: the backend that served (``usage``; None: none did) and the
        tries the router gave up on while their backend reasoned. ``output_est``: the output's
        estimate in tokens, for where ``usage`` lacks it (``accounting.fill_missing``)."""
        model, decided, req = f.model, f.decided, f.req
        if model is None or decided is None or req is None or f.execution is None:
            return
        decision, catalog = decided.decision, f.rt.catalog
        served = None
        if usage is not None:
            unseen = hidden_output(req, catalog[model], decision.estimate(model))
            served = charge(catalog[model], usage, decided.features.prompt_tokens, output_est, unseen)
        f.charge = given_up(served, f.execution.tries, req, decision, catalog)

    @staticmethod
    def _unserved(f: Flight, tries: list[Try]) -> CostSplit:
        """What ``tries`` were billed without serving (``accounting.unserved_cost``)."""
        req, decided = f.req, f.decided
        assert req is not None and decided is not None
        return unserved_cost(tries, req, decided.decision, f.rt.catalog)

    async def _hold_billed(
        self, f: Flight, principal: Principal, task_budget: float | None, tries: list[Try],
        refuse: bool = True,
    ) -> bool:  # fmt: skip
        """Hold what the tries that did not serve were billed, before the next try, where the
        request's holds do not cover it already (``Admission.hold_billed``): a try given up at a
        timeout and another that serves were two calls paid on one hold, 40 requests at once on a
        key spending 9% past it. Not ``refuse``: whether the budgets could (``may_give_up``)."""
        if (decided := f.decided) is None:
            return True
        owed = self._unserved(f, tries).total
        try:
            more = await self.admission.hold_billed(
                principal, f.task_id, decided.decision, task_budget, owed, f.held, f.held_more
            )
        except (RateLimited, BudgetExceeded):
            if refuse:
                raise
            return False
        if more is not None:
            f.held_more.append(more)
        return True

    def _error(self, wire: Wire, err: RouterError, f: Flight) -> WholeReply:
        f.ended(err.status, err.kind, err.message[:500])
        if f.charge is None:
            self._charge(f, None)
        if isinstance(err, AttemptStopped):
            f.stopped = err
        return error_reply(err, wire.name, _route_headers(f), WholeReply)


def _without_key(raw: bytes, backend: Backend) -> bytes:
    """The error event without the key or what the provider quoted of it (``redact_key``)."""
    text = raw.decode("utf-8", "surrogateescape")
    return redact_key(text, backend.api_key()).encode("utf-8", "surrogateescape")


def _route_headers(f: Flight) -> dict[str, str]:
    h = {"x-request-id": f.request_id}
    if f.charge is not None:  # known before the headers only for a whole reply
        h["x-router-cost-usd"] = f"{f.charge.split.total:.10f}".rstrip("0").rstrip(".")
    if (model := f.model) is not None:
        h["x-router-model"] = model
    if f.decided is not None:
        h["x-router-decision-id"] = f.decided.decision.decision_id
    if f.task_id:
        h["x-router-task-id"] = f.task_id
    return h
