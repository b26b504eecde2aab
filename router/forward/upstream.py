"""The only module that calls model providers.

Two paths, chosen per backend:

* **relay** — the backend speaks the client's protocol and has a known base URL: the request is
  sent with aiohttp over pooled keep-alive connections and the reply's bytes are passed on as
  they come (the router only watches the events go by);
* **translate** — anything else goes through litellm (``router.forward.translate``), which converts the
  request and the reply (streamed or not) between protocols and reaches providers we do not
  speak natively.

The provider request is built here from the allow-listed body, the catalog entry and the key
from the environment: the client chooses none of the URL, the key or the headers.
"""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from router.background import on_daemon_thread
from router.errors import RouterError, UpstreamError, UpstreamTimeout, from_upstream_status, redact_key
from router.forward.timeouts import Timeouts
from router.forward.translate.target import Target
from router.policy.catalog import Backend
from router.protocols import ANTHROPIC, OPENAI_CHAT, WIRES, ClientRequest, sse
from router.protocols.common import FAMILY

DEFAULT_BASES = {
    ("openai", "openai"): "https://api.openai.com/v1",
    ("openai", "openai_responses"): "https://api.openai.com/v1",
    ("anthropic", "anthropic"): "https://api.anthropic.com",
}
_BETA = re.compile(r"^[a-z0-9.,_ -]{1,512}$")
ANTHROPIC_VERSION = "2023-06-01"


def relay_base(backend: Backend, client_protocol: str) -> str | None:
    """The base URL to relay to, or None when litellm must translate."""
    if FAMILY[client_protocol] != backend.protocol:
        return None
    return backend.api_base or DEFAULT_BASES.get((backend.provider, backend.protocol))


def provider_body(req: ClientRequest, backend: Backend) -> dict[str, Any]:
    """The client's allow-listed body, fitted to this backend."""
    body = dict(req.body)
    body["model"] = backend.wire_model
    limit = backend.max_output_tokens
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int) and body[key] > limit:
            body[key] = limit
    if req.protocol == OPENAI_CHAT and req.stream:
        # Usage is needed for accounting; the usage chunk is hidden from clients that did not ask.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if req.protocol == ANTHROPIC and "thinking" in body and not backend.thinking:
        body.pop("thinking")
    return body


def provider_json(req: ClientRequest, body: dict[str, Any]) -> bytes:
    """``body`` (``provider_body``) as JSON: a value forwarded as the client sent it is the client's
    own, encoded once when parsed (``ClientRequest.encoded``; an agent's conversation is most of
    the bytes), and only what this backend changed is encoded here."""
    encoded = req.encoded
    return orjson.dumps(
        {
            k: orjson.Fragment(e[1]) if (e := encoded.get(k)) is not None and e[0] is v else v
            for k, v in body.items()
        }
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole reply in the client's protocol: parsed, and as received when it is relayed."""

    obj: dict[str, Any]
    raw: bytes | None = None

    def body(self) -> bytes:
        return self.raw if self.raw is not None else orjson.dumps(self.obj)


class Upstream:
    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._translation: asyncio.Future[None] | None = None

    @property
    def translation_ready(self) -> bool:
        """Whether litellm is loaded (translated calls no longer wait for it)."""
        return self._translation is not None and self._translation.done()

    async def prepare_translation(self) -> None:
        """Load litellm on a thread, once; every translated call awaits this first.

        Started in the background when the router is up, so a start (or a restart after a
        crash) is not held up by seconds of imports that relayed traffic never needs.
        """
        if self._translation is None:
            self._translation = asyncio.ensure_future(_load_translation())
        await asyncio.shield(self._translation)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, keepalive_timeout=60, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeouts.connect, sock_read=self.timeouts.idle
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, json_serialize=lambda o: orjson.dumps(o).decode(),
            auto_decompress=True, skip_auto_headers=("User-Agent",),
            # One session serves every client: a cookie a provider sets for one must not reach
            # another's call (and the jar's bookkeeping is per-request work for nothing).
            cookie_jar=aiohttp.DummyCookieJar(),
        )  # fmt: skip

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(
        self, req: ClientRequest, backend: Backend, client_headers: dict[str, str]
    ) -> dict[str, str]:
        key = backend.api_key()
        headers = {"content-type": "application/json", "user-agent": "router/0.1"}
        if backend.protocol == "anthropic":
            if key:
                headers["x-api-key"] = key
            version = client_headers.get("anthropic-version", ANTHROPIC_VERSION)
            headers["anthropic-version"] = version if _BETA.match(version) else ANTHROPIC_VERSION
            beta = client_headers.get("anthropic-beta")
            if beta and _BETA.match(beta):
                headers["anthropic-beta"] = beta
        elif key:
            headers["authorization"] = f"Bearer {key}"
        if req.stream:
            headers["accept"] = "text/event-stream"
        return headers

    def _url(self, url: str) -> URL:
        # Parsing the same few backend URLs on every call showed in profiles; they are cached.
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = URL(url)
        return parsed

    async def _post(
        self, url: str, data: bytes, headers: dict[str, str], backend: Backend
    ) -> aiohttp.ClientResponse:
        assert self._session is not None, "Upstream.start() was not called"
        try:
            resp = await self._session.post(self._url(url), data=data, headers=headers)
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout("connect", self.timeouts.connect) from None
        except aiohttp.ServerTimeoutError:
            raise UpstreamTimeout("idle", self.timeouts.idle) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"backend {backend.id!r} unreachable: {type(exc).__name__}") from None
        if resp.status >= 400:
            raw = await resp.read()
            resp.release()
            text = _error_text(raw, backend.api_key())
            err = from_upstream_status(
                resp.status, f"backend {backend.id!r} answered {resp.status}: {text}",
                _retry_after(resp.headers.get("retry-after")),
            )  # fmt: skip
            if resp.status == 400 and _too_long(raw):
                # Lets the executor fall over to a larger window, as litellm's translated calls do.
                err.code = "context_length_exceeded"
            raise err
        return resp

    async def complete(
        self,
        req: ClientRequest,
        backend: Backend,
        client_headers: dict[str, str],
        prompt_tokens: int | None = None,
    ) -> Reply:
        """A non-streamed reply, in the client's protocol. ``prompt_tokens``: the decision's
        estimate of the prompt in the backend's tokens, for the output a translated call asks for."""
        base = relay_base(backend, req.protocol)
        if base is None:
            from router.forward import translate

            await self.prepare_translation()
            target = self._target(backend, prompt_tokens)
            obj = await translate.complete(req.protocol, provider_body(req, backend), target)
            return Reply(obj)
        wire = WIRES[req.protocol]
        data = provider_json(req, provider_body(req, backend))
        resp = await self._post(base + wire.path, data, self._headers(req, backend, client_headers), backend)
        try:
            raw = await resp.read()
        except aiohttp.ServerTimeoutError:
            raise UpstreamTimeout("idle", self.timeouts.idle) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"backend {backend.id!r} broke off its reply: {type(exc).__name__}") from None
        finally:
            resp.release()
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"backend {backend.id!r} sent a reply that is not JSON") from None
        if not isinstance(obj, dict):
            raise UpstreamError(f"backend {backend.id!r} sent a reply that is not a JSON object")
        return Reply(obj, raw)

    async def open_stream(
        self,
        req: ClientRequest,
        backend: Backend,
        client_headers: dict[str, str],
        prompt_tokens: int | None = None,
    ) -> AsyncIterator[sse.Event]:
        """Start a streamed call; errors before the reply starts raise here, later ones from the iterator."""
        base = relay_base(backend, req.protocol)
        if base is None:
            from router.forward import translate

            await self.prepare_translation()
            frames = await translate.open_stream(
                req.protocol, provider_body(req, backend), self._target(backend, prompt_tokens)
            )
            return sse.events(_guard(frames, backend, self.timeouts))
        wire = WIRES[req.protocol]
        data = provider_json(req, provider_body(req, backend))
        resp = await self._post(base + wire.path, data, self._headers(req, backend, client_headers), backend)
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            raw = await resp.read()
            resp.release()
            raise UpstreamError(
                f"backend {backend.id!r} did not stream (content-type {ctype!r}): "
                + _error_text(raw, backend.api_key())
            )
        return sse.events(_guard(resp.content.iter_any(), backend, self.timeouts, resp))

    def _target(self, backend: Backend, prompt_tokens: int | None) -> Target:
        room = None if prompt_tokens is None else output_room(backend, prompt_tokens)
        return Target(
            litellm_model=backend.litellm_model,
            api_base=backend.api_base,
            api_key=backend.api_key(),
            timeout=self.timeouts.overall,
            connect=self.timeouts.connect,
            idle=self.timeouts.idle,
            backend=backend.id,
            output_room=room,
        )


def output_room(backend: Backend, prompt_tokens: int) -> int:
    """The output ``backend``'s window leaves after a prompt estimated at ``prompt_tokens``, less
    a margin for the estimate falling short (5% of it and 256 tokens), within the policy's limit."""
    margin = prompt_tokens // 20 + 256
    return min(backend.max_output_tokens, backend.context_window - prompt_tokens - margin)


async def _load_translation() -> None:
    from router.forward.translate import warm_up
    from router.forward.translate.litellm_setup import get_litellm

    # Not asyncio.to_thread: the exit would wait for the import (see on_daemon_thread).
    await on_daemon_thread(get_litellm, name="load-litellm")
    await warm_up()
    # What litellm built lives as long as the process: keep it out of every later collection
    # (router.app.serve froze what was there at start the same way).
    gc.freeze()


async def _guard(
    chunks: AsyncIterator[bytes],
    backend: Backend,
    timeouts: Timeouts,
    resp: aiohttp.ClientResponse | None = None,
) -> AsyncIterator[bytes]:
    """Turn transport failures mid-stream into router errors that name what happened; release ``resp``."""
    try:
        async for chunk in chunks:
            yield chunk
    except RouterError:
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError):
        raise UpstreamTimeout("idle", timeouts.idle) from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise UpstreamError(f"backend {backend.id!r} broke off the stream: {type(exc).__name__}") from None
    finally:
        await sse.close_quietly(chunks)
        if resp is not None:
            resp.release()


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _too_long(raw: bytes) -> bool:
    """Whether a provider's 400 says the prompt exceeds the model's window (OpenAI's error code,
    Anthropic's messages: it has no code for it), or the prompt and the output the request allows
    do ("input length and `max_tokens` exceed context limit": models before Claude 4.5 refuse
    that), as litellm reads them for the translated path."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return False
    message = err.get("message")
    return err.get("code") == "context_length_exceeded" or (
        isinstance(message, str)
        and (message.startswith("prompt is too long") or "exceed context limit" in message)
    )


def _error_text(raw: bytes, key: str | None, limit: int = 300) -> str:
    """The provider's own error message, short and without ``key``; falls back to a byte count,
    never to the body."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return f"{len(raw)} bytes, not JSON"
    err = obj.get("error") if isinstance(obj, dict) else None
    msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    # Redacted before it is cut: a key that straddled the cut left its first characters behind.
    return redact_key(str(msg), key)[:limit] if msg else "no message"


__all__ = ["Upstream", "provider_body", "provider_json", "relay_base"]
