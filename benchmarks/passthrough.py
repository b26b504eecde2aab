"""The floor: issue 8's "40-line FastAPI + uvicorn + aiohttp pass-through", run beside the router.

It forwards each body unchanged to the upstream (``PASSTHROUGH_UPSTREAM``) on a pooled aiohttp
session and relays the reply — streamed or not — byte for byte: no parsing, no routing, no log,
no metrics. What it costs on the machine of a run is what the framework, the server and the
HTTP client cost there; the router's rows above it are the price of everything else.

``python -m uvicorn benchmarks.passthrough:app --port N`` (``benchmarks.run`` starts it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

UPSTREAM_ENV = "PASSTHROUGH_UPSTREAM"


@asynccontextmanager
async def _session(app: FastAPI) -> AsyncIterator[None]:
    app.state.upstream = os.environ[UPSTREAM_ENV]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app.state.session = session
        yield


app = FastAPI(lifespan=_session)


@app.post("/v1/chat/completions")
@app.post("/v1/messages")
async def forward(request: Request) -> Response:
    headers = {k: v for k, v in request.headers.items() if k in ("content-type", "anthropic-version")}
    resp = await request.app.state.session.post(
        request.app.state.upstream + request.url.path, data=await request.body(), headers=headers
    )
    kind = resp.headers.get("content-type", "application/json")
    if not kind.startswith("text/event-stream"):
        body = await resp.read()
        resp.release()
        return Response(body, resp.status, media_type=kind)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        finally:
            resp.release()

    return StreamingResponse(relay(), resp.status, media_type=kind)
