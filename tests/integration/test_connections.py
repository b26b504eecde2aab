"""Accepted connections: Nagle is off whatever socket the listener was made from."""

from __future__ import annotations

import socket

import httpx

from tests.integration.conftest import RunningRouter


def test_accepted_connections_have_nagle_off(router: RunningRouter) -> None:
    # The fixture hands uvicorn a listener made by socket.socket() (proto 0), as a process manager
    # would: asyncio then leaves TCP_NODELAY off, and each reply on a reused connection waited for
    # the client's delayed ACK (~40 ms a request).
    with httpx.Client(base_url=router.url) as client:
        assert client.get("/healthz").status_code == 200
        connections = list(router.server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
