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
from typing import Any

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: How long a refused connection is kept half-closed so the client reads the answer.
_LINGER_S = 2.0


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
        self._refusal_sent = False

    @classmethod
    def with_limits(cls, limits: Limits) -> type[GuardedHttpTools]:
        return type("GuardedHttpTools", (cls,), {"limits": limits})

    # -- connection -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _no_delay(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "Service Unavailable", "too many connections; retry shortly", "api_error")
            return
        self._arm(self.limits.header_timeout_s, self._headers_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refusal_sent:  # what a refused client still sends is read and dropped
            super().data_received(data)

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
        if self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout_s, self._body_too_slow)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.limits.body_timeout_s, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this for whatever the parser refused, our own limits included.
        self._disarm()
        status, reason, message, kind = self._refusal or (
            400,
            "Bad Request",
            "malformed HTTP request",
            "invalid_request_error",
        )
        self._refusal_sent = True
        self.transport.write(error_response(status, reason, message, kind))
        if self.transport.can_write_eof():
            # A lingering close, as nginx does: closing with the client's bytes still unread
            # would reset the connection, and the client might never read why.
            self.transport.write_eof()
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
