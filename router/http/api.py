"""HTTP endpoints: the three proxied protocols, token counting, models, route preview, health."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from router.errors import BadRequest, RouterError
from router.features import request as features
from router.features.task.context import preview_task
from router.http.ops import register_ops
from router.http.outcomes import post_outcome
from router.http.proxy import Proxy, read_body, rule_headers
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, WIRES
from router.protocols import anthropic as anthropic_protocol

if TYPE_CHECKING:
    from router.app.factory import Services


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def register(app: FastAPI, s: Services, proxy: Proxy) -> None:
    started = int(time.time())

    # router.app.asgi.RouterApp serves these three before FastAPI sees them; they are declared here for
    # the OpenAPI document (and for the FastAPI app mounted on its own).
    @app.post("/v1/chat/completions", tags=["proxy"])
    async def chat_completions(request: Request) -> Response:
        return await proxy.handle(request, OPENAI_CHAT)

    @app.post("/v1/messages", tags=["proxy"])
    async def messages(request: Request) -> Response:
        return await proxy.handle(request, ANTHROPIC)

    @app.post("/v1/responses", tags=["proxy"])
    async def responses(request: Request) -> Response:
        return await proxy.handle(request, OPENAI_RESPONSES)

    @app.post("/v1/messages/count_tokens", tags=["proxy"])
    async def count_tokens(request: Request) -> Response:
        try:
            await s.auth.check(request)
            req = anthropic_protocol.parse(
                await read_body(request, s.settings.max_body_bytes), count_only=True
            )
        except RouterError as err:
            return _json(err.anthropic_body(), err.status)
        n = s.counter.count_anthropic(req.system, req.messages, req.tools or None)
        return _json({"input_tokens": n})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's own refusals (405, 404) in the protocol's shape, like every other error.
        err = BadRequest(str(exc.detail))
        err.status = exc.status_code
        if exc.status_code == 404:
            err.anthropic_type = "not_found_error"
        body = err.anthropic_body() if request.url.path.startswith("/v1/messages") else err.openai_body()
        return Response(orjson.dumps(body), exc.status_code, exc.headers, "application/json")

    # With auth on, what the router serves and how it is configured is for callers only: the
    # route and backend list, and the API description. Health and metrics stay open.
    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        try:
            await s.auth.check(request)
        except RouterError as err:
            return _json(err.openai_body(), err.status)
        return _json(app.openapi())

    @app.get("/v1/models", tags=["info"])
    async def models(request: Request) -> Response:
        try:
            await s.auth.check(request)
        except RouterError as err:
            return _json(err.openai_body(), err.status)
        # One list that both SDKs accept: OpenAI reads id/object/owned_by, Anthropic type/id/display_name.
        # Limits in the fields clients read (OpenRouter's context_length, litellm's max_*_tokens):
        # a route gets the largest of its models', since the router sends what fits to one that takes it.
        limits = {b.id: (b.context_window, b.max_output_tokens) for b in s.catalog.backends.values()}
        for r in s.policy.routes:
            if not any(c in r.match for c in "*?["):
                ids = [*r.candidates, *([r.passthrough] if r.passthrough else []), *r.fallbacks]
                limits.setdefault(r.match, (max(limits[i][0] for i in ids), max(limits[i][1] for i in ids)))
        names = [r.match for r in s.policy.routes if r.match in limits]
        names += [b for b in s.catalog.backends if b not in names]
        data = [
            {"id": n, "object": "model", "type": "model", "display_name": n, "owned_by": "router",
             "created": started, "created_at": "1970-01-01T00:00:00Z", "context_length": limits[n][0],
             "max_input_tokens": limits[n][0], "max_output_tokens": limits[n][1]}
            for n in names
        ]  # fmt: skip
        return _json(
            {
                "object": "list",
                "data": data,
                "has_more": False,
                "first_id": names[0] if names else None,
                "last_id": names[-1] if names else None,
                "routes": [r.model_dump(exclude_defaults=True) for r in s.policy.routes],
            }
        )

    @app.post("/v1/route", tags=["info"])
    async def route(request: Request) -> Response:
        """The decision the router would make for this body, without calling any backend."""
        protocol = request.query_params.get("protocol")
        try:
            await s.auth.check(request)
            raw = await read_body(request, s.settings.max_body_bytes)
            protocol = protocol or _detect(raw, request)
            if protocol not in WIRES:
                raise BadRequest(f"unknown protocol {protocol!r}; use one of {', '.join(WIRES)}")
            req = WIRES[protocol].parse(raw)
            feats = features.extract(req, s.counter, rule_headers(request.headers))
            preview_task(s, req, feats)
            decision = s.decider.decide(feats)
        except RouterError as err:
            return _json(err.openai_body(), err.status)
        return _json(
            {
                "protocol": protocol,
                "requested_model": req.model,
                "chosen": decision.chosen,
                "order": decision.order,
                "reason": decision.reason,
                "policy": decision.policy,
                "propensity": decision.propensity,
                "rules_applied": decision.rules_applied,
                "prompt_tokens": feats.prompt_tokens,
                "side_call": feats.side_call,
                "candidates": [e.as_dict() for e in decision.candidates],
            }
        )

    @app.post("/v1/outcomes", tags=["outcomes"])
    async def outcomes(request: Request) -> Response:
        return await post_outcome(request, s)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz", tags=["health"])
    async def readyz() -> Response:
        if s.draining:
            return _json({"status": "draining"}, 503)
        # A degraded replica still serves: the log buffers while its store is down, and pins and
        # rate limits fall back to local state while Redis is (budgets refuse with 503 meanwhile).
        try:
            async with asyncio.timeout(1.0):  # a hung store must not hang the health check
                store_ok = await s.store.ping()
        except TimeoutError:
            store_ok = False
        state_ok = await s.state.ping()
        rejected = s.history.last_rejected
        log_trouble = s.writer.trouble
        body = {
            "status": "ok"
            if store_ok and state_ok and rejected is None and log_trouble is None
            else "degraded",
            "store": store_ok,
            "shared_state": state_ok,
            "log_buffered": s.writer.buffered,
            # Cross-protocol calls wait for litellm until it has loaded (seconds after a start).
            "translation_loaded": s.upstream.translation_ready,
            # Answered requests not yet in the log: a failing store (a full disk) or a backlog.
            "log_error": log_trouble,
            "state_fail_open": dict(s.state.fail_open_counts),
            "state_error": None if state_ok else s.state.last_error,
            "policy": s.policy.name,
            "scorer": s.decider.scorer.name,
            "policy_revision": s.runtime.revision,
            # The file on disk was refused: the router serves the previous revision meanwhile.
            "policy_rejected": rejected.as_dict() if rejected else None,
        }
        return _json(body)

    register_ops(app, s)


def _detect(raw: bytes, request: Request) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return OPENAI_CHAT  # parsing reports the error in detail
    if isinstance(body, dict) and "input" in body:
        return OPENAI_RESPONSES
    if request.headers.get("anthropic-version") or (isinstance(body, dict) and "system" in body):
        return ANTHROPIC
    return OPENAI_CHAT
