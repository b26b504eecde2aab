"""The fake upstream's HTTP server: routes, behaviour resolution, fault injection and recording."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl

import orjson
from aiohttp import web

from router.errors import BadRequest, ContextTooLarge, RouterError, from_upstream_status
from router.fakeupstream import behaviour as bh
from router.fakeupstream.anthropic import AnthropicMessages, count_tokens
from router.fakeupstream.openai_chat import OpenAIChat
from router.fakeupstream.reply import FakeReply, Frame, Ids, Planner, Prompt
from router.fakeupstream.responses import Responses

MODELS = ("fake-small", "fake-large", "fake-reasoning")
RECORDED_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "user-agent",
        "content-type",
        bh.HEADER,
    }
)
MAX_BODY = 64 * 1024 * 1024
_JSON = "application/json"


class Dialect(Protocol):
    """One provider wire format (implemented in openai_chat, anthropic and responses)."""

    request_id_header: str
    broken_frame: bytes
    #: The provider's own mid-stream error event.
    error_frame: bytes
    #: The provider's context-length error message, with ``{tokens}`` and ``{window}``.
    context_message: str

    def prompt(self, body: dict[str, Any], model: str) -> Prompt: ...
    def complete(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> dict[str, Any]: ...
    def frames(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> list[Frame]: ...
    def error_body(self, error: RouterError) -> dict[str, Any]: ...


class Recorder:
    """The last requests the server saw, for tests to inspect. Only touched on the server's loop.

    Bodies are kept as the raw bytes already read and parsed only when asked for: holding parsed
    agent-sized bodies would cost far more memory and slow the garbage collector on the hot path.
    """

    def __init__(self, limit: int = 1000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._log: deque[tuple[str, str, str, dict[str, str], bytes, float]] = deque(maxlen=limit)
        self._max_bytes = max_bytes
        self._bytes = 0

    def add(self, request: web.Request, raw: bytes) -> None:
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() in RECORDED_HEADERS}
        if len(self._log) == self._log.maxlen:
            self._bytes -= len(self._log[0][4])
        self._log.append((request.method, request.path, request.query_string, headers, raw, time.time()))
        self._bytes += len(raw)
        while self._bytes > self._max_bytes and len(self._log) > 1:
            self._bytes -= len(self._log.popleft()[4])

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "method": method,
                "path": path,
                "query": dict(parse_qsl(query, keep_blank_values=True)),
                "headers": headers,
                "body": _parse(raw),
                "time": at,
            }
            for method, path, query, headers, raw, at in self._log
        ]

    def clear(self) -> int:
        n = len(self._log)
        self._log.clear()
        self._bytes = 0
        return n


def _parse(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


class FakeServer:
    """Request handlers plus the state they share. All state is touched only on the server's loop."""

    def __init__(self, default: bh.Behaviour, per_model: Mapping[str, bh.Behaviour]) -> None:
        self.default = default
        self.recorder = Recorder()
        self.planner = Planner()
        self.ids = Ids()
        self._per_model: dict[str, bh.Overrides] = {m: b.overrides() for m, b in per_model.items()}
        self._failures: dict[str, int] = {}
        self._chat = OpenAIChat()
        self._messages = AnthropicMessages()
        self._counting = AnthropicMessages(require_max_tokens=False)
        self._responses = Responses()
        #: Streams being written now: a test can see whether a client's leaving closed them.
        self.open_streams = 0

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
            web.post("/v1/responses", self.responses),
            web.get("/v1/models", self.models),
            web.get("/_control/requests", self.get_requests),
            web.delete("/_control/requests", self.clear_requests),
            web.post("/_control/behaviour", self.post_behaviour),
            # Last: any other path is recorded and refused, so a test sees what a provider's
            # translation sent even where this server speaks no such API (Anthropic's /v1/complete).
            web.route("*", "/{path:.*}", self.unknown),
        ]

    def set_behaviour(self, model: str, overrides: bh.Overrides) -> None:
        """Replace a model's behaviour (empty overrides clear it) and restart its failure counts."""
        if overrides:
            self._per_model[model] = overrides
        else:
            self._per_model.pop(model, None)
        for key in [k for k in self._failures if bh.split_model(k)[0] == model]:
            del self._failures[key]

    # -- provider endpoints ------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self._chat)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self._messages)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self._responses)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        dialect = self._counting
        body = await self._read(request)
        try:
            name, _ = self._model(body)
            prompt = dialect.prompt(body, name)
        except BadRequest as exc:
            return _error(dialect, exc)
        return _json({"input_tokens": count_tokens(prompt)})

    async def models(self, request: web.Request) -> web.StreamResponse:
        names = [*MODELS, *(m for m in self._per_model if m not in MODELS)]
        if "anthropic-version" in request.headers:
            data: list[dict[str, Any]] = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in names
            ]
            return _json({"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake-upstream"} for m in names]
        return _json({"object": "list", "data": data})

    async def _read(self, request: web.Request) -> Any:
        raw = await request.read()
        self.recorder.add(request, raw)
        return _parse(raw)

    def _model(self, body: Any) -> tuple[str, str]:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: Field required (a string)", param="model")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise BadRequest("stream: expected a boolean", param="stream")
        return bh.split_model(model)

    def _behaviour(self, name: str, spec: str, header: str | None) -> bh.Behaviour:
        layers = []
        per_model = self._per_model.get(name)
        if per_model:
            layers.append(per_model)
        if spec:
            layers.append(bh.parse_spec(spec))
        if header:
            layers.append(bh.parse_spec(header))
        return bh.merge(self.default, *layers)

    def _injected_failure(self, key: str, behaviour: bh.Behaviour) -> int | None:
        """The status to fail this request with, counting ``fail_times`` per model string."""
        status = behaviour.failing_status()
        if status is None or behaviour.fail_times is None:
            return status
        failed = self._failures.get(key, 0)
        if failed >= behaviour.fail_times:
            return None
        self._failures[key] = failed + 1
        return status

    async def _generate(self, request: web.Request, dialect: Dialect) -> web.StreamResponse:
        body = await self._read(request)
        try:
            name, spec = self._model(body)
            behaviour = self._behaviour(name, spec, request.headers.get(bh.HEADER))
            prompt = dialect.prompt(body, name)
        except bh.BehaviourError as exc:
            return _error(dialect, BadRequest(f"fake upstream: {exc}"))
        except BadRequest as exc:
            return _error(dialect, exc)
        status = self._injected_failure(body["model"], behaviour)
        if status is not None:
            message = f"fake upstream: injected {status} error for model {name}"
            if behaviour.echo_key:
                message += echoed_key(_presented_key(request))
            error = from_upstream_status(status, message, behaviour.retry_after)
            return _error(dialect, error, status, behaviour.retry_after)
        reply = self.planner.plan(prompt, behaviour)
        window, tokens = behaviour.context_window, reply.usage.input_tokens
        if window is not None and behaviour.window_holds_output and tokens + _output_allowed(body) > window:
            said = (
                f"input length and `max_tokens` exceed context limit: {tokens} + {_output_allowed(body)} > "
                f"{window}, decrease input length or `max_tokens` and try again"
            )
            return _error(dialect, BadRequest(said))
        if window is not None and tokens > window:
            return _error(
                dialect, ContextTooLarge(dialect.context_message.format(tokens=tokens, window=window))
            )
        if body.get("stream"):
            self.open_streams += 1
            try:
                error_frame = dialect.error_frame
                if behaviour.echo_key:
                    error_frame = _echoing(error_frame, request)
                if behaviour.failed_event and isinstance(dialect, Responses):
                    error_frame = dialect.failed_frame(reply, body, self.ids)
                frames = dialect.frames(reply, body, self.ids)
                return await _stream(request, dialect, frames, behaviour, error_frame)
            finally:
                self.open_streams -= 1
        pause_ms = behaviour.ttft_ms + behaviour.ms_per_max_token * _output_allowed(body)
        if pause_ms:
            await asyncio.sleep(pause_ms / 1000)
        if behaviour.break_after is not None:
            return _abort(request)
        whole = dialect.complete(reply, body, self.ids)
        if behaviour.no_usage:
            whole.pop("usage", None)
        payload = orjson.dumps(whole)
        if behaviour.malformed:
            payload = payload[: len(payload) // 2]
        return web.Response(body=payload, content_type=_JSON, headers={dialect.request_id_header: "req_fake"})

    async def unknown(self, request: web.Request) -> web.StreamResponse:
        await self._read(request)
        return _json({"error": {"message": f"no such endpoint: {request.path}", "type": "not_found"}}, 404)

    # -- control endpoints -------------------------------------------------------------------------

    async def get_requests(self, request: web.Request) -> web.StreamResponse:
        return _json(self.recorder.snapshot())

    async def clear_requests(self, request: web.Request) -> web.StreamResponse:
        return _json({"cleared": self.recorder.clear()})

    async def post_behaviour(self, request: web.Request) -> web.StreamResponse:
        fields = _parse(await request.read())
        if not isinstance(fields, dict) or not isinstance(fields.get("model"), str):
            return _json({"error": "expected a JSON object with a string 'model'"}, status=400)
        model = fields.pop("model")
        try:
            overrides = bh.validate(fields)
        except bh.BehaviourError as exc:
            return _json({"error": str(exc)}, status=400)
        self.set_behaviour(model, overrides)
        return _json({"model": model, "behaviour": dict(overrides)})


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type=_JSON)


def _error(
    dialect: Dialect, error: RouterError, status: int | None = None, retry_after: float | None = None
) -> web.Response:
    headers = {dialect.request_id_header: "req_fake"}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    return web.Response(
        body=orjson.dumps(dialect.error_body(error)),
        status=status or error.status,
        content_type=_JSON,
        headers=headers,
    )


def _abort(request: web.Request) -> web.StreamResponse:
    """Drop the TCP connection without a proper end, like a provider that crashes mid-answer."""
    if request.transport is not None:
        request.transport.abort()
    # aiohttp needs a response object; it is never sent because the transport is gone.
    return web.Response(status=500)


def _output_allowed(body: Mapping[str, Any]) -> int:
    """The output tokens a request allows, in whichever field its protocol names them."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def echoed_key(key: str) -> str:
    """What ``echo_key`` adds to an error message: the key, then the parts of it and of its
    account that OpenAI's own errors quote (its start and last four characters, an organization id)."""
    return (
        f"; the key sent: {key}; Incorrect API key provided: {key[:8]}{'*' * 20}{key[-4:]}."
        f" Rate limit reached for requests in organization {fake_organization(key)}."
    )


def fake_organization(key: str) -> str:
    """The organization id the fake gives the account of ``key``."""
    return "org-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def _presented_key(request: web.Request) -> str:
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    return request.headers.get("x-api-key") or bearer


def _echoing(frame: bytes, request: web.Request) -> bytes:
    """A stream's error frame whose message ends with the request's key (``echo_key``)."""
    head, _, data = frame.partition(b"data: ")
    event = orjson.loads(data)
    said = event["error"] if isinstance(event.get("error"), dict) else event
    said["message"] += echoed_key(_presented_key(request))
    return head + b"data: " + orjson.dumps(event) + b"\n\n"


async def _stream(
    request: web.Request, dialect: Dialect, frames: list[Frame], behaviour: bh.Behaviour, error_frame: bytes
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            dialect.request_id_header: "req_fake",
        }
    )
    await response.prepare(request)
    if behaviour.ttft_ms:
        await asyncio.sleep(behaviour.ttft_ms / 1000)
    last_content = max((i for i, (_, content) in enumerate(frames) if content), default=len(frames) - 1)
    end = last_content + 1 if behaviour.truncate else len(frames)
    chunk_s = behaviour.chunk_ms / 1000
    pending: list[bytes] = []
    seen = 0  # content frames written so far
    try:
        # Frames are batched into one write until a pause or a fault needs them on the wire.
        for frame, content in frames[:end]:
            if content:
                pause = 0.0
                if seen == behaviour.error_after:
                    pending.append(error_frame)
                    break
                if seen == behaviour.break_after:
                    await _flush(response, pending)
                    return _abort(request)
                if seen == behaviour.stall_after:
                    pause = behaviour.stall_ms / 1000
                elif seen:
                    pause = chunk_s
                if pause:
                    await _flush(response, pending)
                    await asyncio.sleep(pause)
                if behaviour.malformed and seen == 0:
                    frame = dialect.broken_frame
                seen += 1
            pending.append(frame)
        await _flush(response, pending)
        await response.write_eof()
        return response
    except ConnectionResetError:
        # The router closes a stream whose client left, as a real provider sees it: the rest is
        # dropped quietly (logged, its traceback landed in whatever test ran next).
        return response


async def _flush(response: web.StreamResponse, pending: list[bytes]) -> None:
    if pending:
        await response.write(b"".join(pending))
        pending.clear()


def create_app(
    default: bh.Behaviour | None = None, per_model: Mapping[str, bh.Behaviour] | None = None
) -> web.Application:
    """The fake upstream as an aiohttp application; ``server_of(app)`` reaches its state."""
    server = FakeServer(default or bh.Behaviour(), per_model or {})
    app = web.Application(client_max_size=MAX_BODY)
    app[SERVER] = server
    app.add_routes(server.routes())
    return app


SERVER: web.AppKey[FakeServer] = web.AppKey("fake_upstream_server", FakeServer)


def server_of(app: web.Application) -> FakeServer:
    return app[SERVER]


def run(host: str = "127.0.0.1", port: int = 9100, default: bh.Behaviour | None = None) -> None:
    """Serve until interrupted (blocking). Access logging is off: it would dominate the cost per request."""
    try:
        import uvloop  # installed with uvicorn[standard]; about 20% less CPU per request

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    web.run_app(
        create_app(default),
        host=host,
        port=port,
        access_log=None,
        backlog=1024,
        shutdown_timeout=5.0,
        loop=loop,
        print=lambda *_: print(f"fake upstream listening on http://{host}:{port}", flush=True),
    )
