"""The ASGI application: the proxied endpoints go straight to the proxy, everything else to FastAPI.

The three proxied paths are the hot path — every call of every agent — and FastAPI's stack
(eight middleware layers, dependency solving, wrapped ``send``) cost about a fifth of the
router's CPU per request there while doing nothing for them: the proxy parses and validates
its own bodies, answers errors in each protocol's shape and never raises. So they are
dispatched here first. They stay declared on the FastAPI app too, which is what
``/openapi.json`` documents; the lifespan and every other path are FastAPI's.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from router.http.proxy import Proxy
from router.protocols import PROXIED


class RouterApp:
    """What uvicorn serves: a direct path for proxied POSTs in front of the FastAPI app."""

    def __init__(self, api: FastAPI, proxy: Proxy) -> None:
        self.api = api
        self.proxy = proxy

    @property
    def state(self) -> Any:
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            protocol = PROXIED.get(scope["path"])
            if protocol is not None:
                response = await self.proxy.handle(Request(scope, receive), protocol)
                await response(scope, receive, send)
                return
        await self.api(scope, receive, send)
