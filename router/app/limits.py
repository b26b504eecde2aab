"""Limits on what a client may hold of the server: header size and count, header and body read
timeouts, and a connection cap, as a proxy such as Envoy sets them.

uvicorn's fast HTTP parser (httptools) has none of these: a 64 MiB header is read into memory,
a client that trickles its headers (or stops short of its ``Content-Length``) holds a
connection forever, and connections are not counted. ``GuardedHttpTools`` adds them around
uvicorn's protocol, and answers what it refuses, malformed HTTP included, as a JSON error in
the OpenAI shape (the protocol cannot be known before the request is parsed) rather than
uvicorn's plain text.

Settings (``ROUTER_LIMITS__*``): defaults suit agents on a LAN or behind a load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

#: How long a refused connection is kept half-closed so the client reads the answer: until the
#: client has sent nothing for _LINGER_S, or _LINGER_MAX_S at most (nginx: 5 s and 30 s). A client
#: that sends its whole body before it reads (most do) would otherwise see a reset, not the reply.
_LINGER_S = 2.0
_LINGER_MAX_S = 10.0


class Limits(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    #: Request line and headers together, in bytes (Envoy: 60 KiB; nginx: 4 x 8 KiB).
    max_header_bytes: int = Field(default=64 * 1024, gt=0)
    #: Header lines per request (Envoy: 100).
    max_headers: int = Field(default=100, gt=0)
    #: From a connection's first byte (or its opening) to the end of the request's headers.
    header_timeout_s: float = Field(default=10.0, gt=0)
    #: Longest silence while a request body is being received.
    body_timeout_s: float = Field(default=30.0, gt=0)
    #: Past ``body_timeout_s`` from its headers, a body must have come at this average rate (bytes a
    #: second; Apache's mod_reqtimeout ``MinRate``): each byte received buys ``1 / min_body_rate`` s.
    min_body_rate: float = Field(default=1024.0, gt=0)
    #: Open client connections; more are answered 503 and closed at once.
    max_connections: int = Field(default=4096, gt=0)
    #: An idle keep-alive connection is closed after this long (uvicorn's timeout_keep_alive).
    keep_alive_s: float = Field(default=75.0, gt=0)


def error_response(status: int, reason: str, message: str, kind: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _LingeringClose:
    """A connection's transport as a request's cycle sees it: ``close`` is ``on_close``."""

    def __init__(self, transport: asyncio.Transport, on_close: Callable[[], None]) -> None:
        self._transport = transport
        self.close = on_close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _no_delay(transport: asyncio.Transport) -> None:
    """Nagle off on every accepted connection. asyncio does this only when the listener's proto is
    ``IPPROTO_TCP``, and a listener handed to uvicorn (a process manager's socket, ``socket.socket()``)
    has proto 0: a reply's last write then waited for the client's delayed ACK, ~40 ms on every
    request of a reused connection."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``limits`` enforced (bind them with ``with_limits``)."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._n_headers = 0
        self._timer: asyncio.TimerHandle | None = None
        #: Status line parts and message of a refusal decided inside a parser callback.
        self._refusal: tuple[int, str, str, str] | None = None
        #: Closing lingers: what the client still sends is read and dropped.
        self._discarding = False
        self._linger_until = 0.0
        #: The current request's body is still arriving (the app answered without it, if at all).
        self._body_pending = False
        self._body_started = 0.0
        self._body_bytes = 0

    @classmethod
    def with_limits(cls, limits: Limits) -> type[GuardedHttpTools]:
        return type("GuardedHttpTools", (cls,), {"limits": limits})

    # -- connection -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _no_delay(transport)
        self._cycle_transport = _LingeringClose(transport, self._close)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "Service Unavailable", "too many connections; retry shortly", "api_error")
            return
        self._arm(self.limits.header_timeout_s, self._headers_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._discarding:
            super().data_received(data)
        elif (left := self._linger_until - self.loop.time()) > 0:  # read and dropped while lingering
            self._arm(min(_LINGER_S, left), self.transport.close)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_pending and not self.transport.is_closing():
            # Answered before the body arrived (a 401, a 413): reading on would let the client hold
            # the connection as long as it trickles the rest.
            self._close()

    # -- parser callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = self._n_headers = 0
        # Each request's headers are timed from its first byte (a kept-alive connection's wait
        # before that is uvicorn's keep-alive timeout).
        self._arm(self.limits.header_timeout_s, self._headers_too_slow)

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None:
            return
        # The cycle closes the connection after a reply with "Connection: close": lingering, so the
        # client reads the reply even while it is still sending its body.
        cycle.transport = self._cycle_transport  # type: ignore[assignment]
        self._body_pending = cycle.more_body
        if self._body_pending:
            cycle.send = self._closing_early(cycle)  # type: ignore[method-assign,assignment]
        if self._body_pending:
            self._body_started = self.loop.time()
            self._body_bytes = 0
            self._arm(self.limits.body_timeout_s, self._body_too_slow)

    def _closing_early(self, cycle: RequestResponseCycle) -> Callable[[Any], Awaitable[None]]:
        """``cycle.send``, saying "Connection: close" on a reply that starts before the body is in:
        the connection closes after it (``on_response_complete``), and a client told nothing reused
        it for its next request and got a disconnect instead of a reply (a 403 form post, seen)."""
        send = cycle.send

        async def closing(message: Any) -> None:
            if message["type"] == "http.response.start" and self._body_pending and cycle is self.cycle:
                cycle.keep_alive = False
            await send(message)

        return closing

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        limits = self.limits
        self._body_bytes += len(body)
        now = self.loop.time()
        # The longest silence, and the minimum rate: one byte every few seconds is never silent.
        earned = self._body_started + limits.body_timeout_s + self._body_bytes / limits.min_body_rate
        self._arm(min(limits.body_timeout_s, earned - now), self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        self._body_pending = False
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this for whatever the parser refused, our own limits included.
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # Refused bytes after a whole request that is still being answered (a wrong
            # Content-Length, a broken pipelining client): its reply can no longer come first, and
            # once the connection is half-closed its write raised ("Cannot call write() after
            # write_eof()"), a traceback at ERROR for each such request. Dropped, as if the client
            # had left; the refusal follows only what was sent whole.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self._linger()
                return
        status, reason, message, kind = self._refusal or (
            400,
            "Bad Request",
            "malformed HTTP request",
            "invalid_request_error",
        )
        self.transport.write(error_response(status, reason, message, kind))
        self._linger()

    def _close(self) -> None:
        """Close after a reply: lingering while the request's body is still arriving."""
        if self._body_pending:
            self._linger()
        elif not self.transport.is_closing():
            self.transport.close()

    def _linger(self) -> None:
        """A lingering close, as nginx does: closing with the client's bytes still unread would
        reset the connection, and the client might never read the reply it was sent."""
        if self.transport.is_closing() or self._discarding:
            return
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger_until = self.loop.time() + _LINGER_MAX_S
            self._arm(_LINGER_S, self.transport.close)
        else:
            self.transport.close()

    # -- limits -----------------------------------------------------------------------------------

    def _count(self, size: int, headers: int) -> None:
        self._header_bytes += size
        self._n_headers += headers
        if self._header_bytes > self.limits.max_header_bytes:
            self._stop_parsing(f"request headers exceed {self.limits.max_header_bytes} bytes")
        if self._n_headers > self.limits.max_headers:
            self._stop_parsing(f"more than {self.limits.max_headers} request headers")

    def _stop_parsing(self, message: str) -> None:
        self._refusal = (431, "Request Header Fields Too Large", message, "invalid_request_error")
        # Raised inside a parser callback: httptools stops and uvicorn's data_received answers
        # through send_400_response, before any of it reaches the app.
        raise ValueError(message)

    def _refuse(self, status: int, reason: str, message: str, kind: str) -> None:
        self._refusal = (status, reason, message, kind)
        self.send_400_response(message)

    def _headers_too_slow(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            message = f"request headers not received within {self.limits.header_timeout_s:g}s"
            self._refuse(408, "Request Timeout", message, "invalid_request_error")

    def _body_too_slow(self) -> None:
        self._timer = None
        if self.flow is not None and self.flow.read_paused:
            # The app has not read what came yet: the client is not the slow one.
            self._arm(self.limits.body_timeout_s, self._body_too_slow)
            return
        # The app is already waiting for the body: closing tells it the client is gone (499).
        self.transport.close()

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
