"""HTTP endpoints: the three proxied protocols, token counting, models, route preview."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from router.background import Background
from router.errors import BadRequest, UnknownModel
from router.features.promptsize import INLINE_CHARS
from router.features.tokens import TokenCounter
from router.http.admission import hold_of, worst_of
from router.http.auth import Auth, Principal
from router.http.endpoints import keyed
from router.http.proxy import Proxy, header_dict, read_body
from router.http.replies import error_reply, json_reply
from router.policy.active import ActivePolicyHolder
from router.policy.config import Route
from router.policy.pipeline import parse_body
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, PROXIED, WIRES
from router.protocols import anthropic as anthropic_protocol
from router.protocols.common import ClientRequest


class Api:
    """The protocols' endpoints besides the proxied calls, the model list, and the route preview.

    ``describe``: the app's OpenAPI document (FastAPI's ``app.openapi``), which needs a key to read."""

    def __init__(
        self, *, proxy: Proxy, auth: Auth, counter: TokenCounter, runtime: ActivePolicyHolder, background: Background,
        describe: Callable[[], dict[str, Any]], max_body_bytes: int,
    ) -> None:  # fmt: skip
        self.proxy = proxy
        self.auth = auth
        self.counter = counter
        self.runtime = runtime
        self.background = background
        self.describe = describe
        self.max_body_bytes = max_body_bytes

    def register(self, app: FastAPI) -> None:
        # router.app.asgi.RouterApp serves the proxied paths before FastAPI sees them; they are declared
        # here for the OpenAPI document (and for the FastAPI app mounted on its own).
        for path, protocol in PROXIED.items():
            app.add_api_route(
                path, _proxied(self.proxy, protocol), methods=["POST"], tags=["proxy"], name=protocol
            )
        app.add_api_route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"], tags=["proxy"])
        app.add_exception_handler(StarletteHTTPException, http_error)
        app.add_api_route("/openapi.json", self.openapi, methods=["GET"], include_in_schema=False)
        app.add_api_route("/v1/models", self.models, methods=["GET"], tags=["info"])
        app.add_api_route("/v1/models/{model_id:path}", self.model, methods=["GET"], tags=["info"])
        app.add_api_route("/v1/route", self.route, methods=["POST"], tags=["info"])

    @keyed(ANTHROPIC)
    async def count_tokens(self, request: Request, principal: Principal) -> Response:
        raw = await read_body(request, self.max_body_bytes)
        req = await parse_body(self.background, partial(anthropic_protocol.parse, count_only=True), raw)
        # As /v1/messages would refuse it: a key restricted with --models gets nothing for another.
        principal.authorize_model(req.model)
        # Off the event loop unless short: a large prompt's count would stall every client.
        if len(raw) <= INLINE_CHARS:
            return json_reply({"input_tokens": self.counter.count_request(req)})
        return json_reply({"input_tokens": await self.background.in_thread(self.counter.count_request, req)})

    # With auth on, what the router serves and how it is configured is for callers only: the
    # route and backend list, and the API description. Health and metrics stay open.
    @keyed()
    async def openapi(self, request: Request, principal: Principal) -> Response:
        return json_reply(self.describe())

    @keyed()
    async def models(self, request: Request, principal: Principal) -> Response:
        data = self.model_list(principal)
        names = [m["id"] for m in data]
        routes = self.runtime.current.policy.routes
        # A key restricted with --models sees the names it may ask for, never the backends behind
        # them (a route's candidates): those are the ones it was restricted from.
        shown = (
            [r.model_dump(exclude_defaults=True) for r in routes]
            if principal.models is None
            else [{"match": r.match} for r in routes if principal.may_use(r.match)]
        )
        return json_reply(
            {
                "object": "list",
                "data": data,
                "has_more": False,
                "first_id": names[0] if names else None,
                "last_id": names[-1] if names else None,
                "routes": shown,
            }
        )

    # The SDKs' models.retrieve: it was a bare 404 "Not Found" for a name the list gives.
    @keyed(lambda request: ANTHROPIC if request.headers.get("anthropic-version") else OPENAI_CHAT)
    async def model(self, request: Request, principal: Principal, model_id: str) -> Response:
        listed = self.model_list(principal)
        found = next((m for m in listed if m["id"] == model_id), None)
        policy = self.runtime.current.policy
        route = policy.route_for(model_id)
        if found is None and route is not None and principal.may_use(model_id):
            # A name a pattern route serves (claude-* and claude-sonnet-4-5) is served by POST, and
            # was a 404 here: it is described with its route's limits.
            found = self._entry(model_id, self._route_limits(route))
        if found is None:
            # The list gives backends no route serves too (for their limits): asking for one is a 404.
            names = ", ".join(m["id"] for m in listed if policy.route_for(m["id"]) is not None)
            raise UnknownModel(f"model {model_id!r} is not served here; ask for one of: {names}")
        return json_reply(found)

    def _route_limits(self, route: Route) -> tuple[int, int]:
        """A route's context window and output limit: the largest of its models', since the router
        sends what fits to one that takes it."""
        catalog = self.runtime.current.catalog
        ids = [*route.chosen_among, *route.fallbacks]
        backends = [catalog.backends[i] for i in ids]
        return max(b.context_window for b in backends), max(b.max_output_tokens for b in backends)

    def _entry(self, name: str, limits: tuple[int, int]) -> dict[str, Any]:
        """One model as both SDKs accept it: OpenAI reads id/object/owned_by, Anthropic
        type/id/display_name; its limits in the fields clients read (OpenRouter's context_length,
        litellm's max_*_tokens)."""
        # When this catalog was loaded: a reload that changes the models changes their date.
        loaded = self.runtime.current.applied_at
        created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(loaded))
        return {"id": name, "object": "model", "type": "model", "display_name": name, "owned_by": "router",
                "created": int(loaded), "created_at": created_at, "context_length": limits[0],
                "max_input_tokens": limits[0], "max_output_tokens": limits[1]}  # fmt: skip

    def model_list(self, principal: Principal) -> list[dict[str, Any]]:
        policy, catalog = self.runtime.current.policy, self.runtime.current.catalog
        limits = {b.id: (b.context_window, b.max_output_tokens) for b in catalog.backends.values()}
        for r in policy.routes:
            if not any(c in r.match for c in "*?["):
                limits.setdefault(r.match, self._route_limits(r))
        names = [r.match for r in policy.routes if r.match in limits]
        names += [b for b in catalog.backends if b not in names]
        return [self._entry(n, limits[n]) for n in names if principal.may_use(n)]

    @keyed()
    async def route(self, request: Request, principal: Principal) -> Response:
        """The decision the proxy would make for this body now, without calling any backend."""
        raw = await read_body(request, self.max_body_bytes)
        given = request.query_params.get("protocol")
        if given is not None and given not in WIRES:
            raise BadRequest(f"unknown protocol {given!r}; use one of {', '.join(WIRES)}")
        anthropic_version = bool(request.headers.get("anthropic-version"))
        # Detected with the parse, off the loop for a large body: reading it is most of the parse.
        req = await parse_body(self.background, partial(_parse_detected, given, anthropic_version), raw)
        protocol = req.protocol
        # As the proxy would refuse it: the decision names the backends and prices of a model the
        # key was restricted from, which GET /v1/models keeps from it.
        principal.authorize_model(req.model)
        decided = await self.proxy.preview(req, principal, header_dict(request), len(raw))
        decision, feats = decided.decision, decided.features
        return json_reply(
            {
                "protocol": protocol,
                "requested_model": req.model,
                "chosen": decision.chosen,
                "order": decision.order,
                "reason": decision.reason,
                "policy": decision.policy,
                "propensity": decision.propensity,
                "explored": decision.explored,
                "rules_applied": decision.rules_applied,
                "prompt_tokens": feats.prompt_tokens,
                "side_call": feats.side_call,
                "task_id": decided.task.task_id,
                "attempt": feats.attempt,
                "pinned": feats.pinned,
                "arm": decided.arm,
                "candidates": [e.as_json() for e in decision.candidates],
                "fallbacks": [e.as_json() for e in decision.fallbacks],
                # What admission holds for it in each budget, by the same functions: at least its
                # hold, and of what a key's budget has left up to its worst case, which counts a
                # given-up try that no candidate's ``worst_usd`` does.
                "hold_usd": hold_of(decision),
                "worst_usd": worst_of(decision),
            }
        )


async def http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's own refusals (405, 404) in the protocol's shape, like every other error."""
    assert isinstance(exc, StarletteHTTPException)  # registered for it alone
    err = BadRequest(_refusal(request, exc))
    err.status = exc.status_code
    if exc.status_code == 404:
        err.anthropic_type = "not_found_error"
    protocol = ANTHROPIC if "/messages" in request.url.path else OPENAI_CHAT  # /v1/v1/messages too
    return error_reply(err, protocol, exc.headers)


def _refusal(request: Request, exc: StarletteHTTPException) -> str:
    """What went wrong in the client's setup, where Starlette said only "Not Found": most often a
    base URL without /v1 (OpenAI clients) or with it (Anthropic clients add their own)."""
    method, path = request.method, request.url.path
    if exc.status_code == 405 and exc.headers and "allow" in {k.lower() for k in exc.headers}:
        allowed = next(v for k, v in exc.headers.items() if k.lower() == "allow")
        return f"{method} is not allowed on {path} (allowed: {allowed})"
    if exc.status_code != 404 or exc.detail != "Not Found":
        return str(exc.detail)
    if f"/v1{path}" in PROXIED:
        return f"no endpoint {path}: the router serves /v1{path}, so an OpenAI client's base URL ends in /v1"
    if path.startswith("/v1/v1/"):
        return (f"no endpoint {path}: the base URL ends in /v1 and the client adds its own; an Anthropic "
                "client's base URL is the router's address alone")  # fmt: skip
    return f"no endpoint {method} {path}: the router serves POST {', '.join(PROXIED)} and GET /v1/models"


def _proxied(proxy: Proxy, protocol: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await proxy.handle(request, protocol)

    return endpoint


def _parse_detected(given: str | None, anthropic_version: bool, raw: bytes) -> ClientRequest:
    """``raw`` parsed in the protocol ``given``, else the one its shape says."""
    return WIRES[given or _detect(raw, anthropic_version)].parse(raw)


def _detect(raw: bytes, anthropic_version: bool) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return OPENAI_CHAT  # parsing reports the error in detail
    if isinstance(body, dict) and "input" in body:
        return OPENAI_RESPONSES
    if anthropic_version or (isinstance(body, dict) and "system" in body):
        return ANTHROPIC
    return OPENAI_CHAT
