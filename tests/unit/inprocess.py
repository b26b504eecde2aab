"""The whole router in this process: the real app and services over an in-process ASGI transport.

No server and no port for the router (the fake provider still listens on its own ephemeral port):
requests go through the same ``RouterApp`` uvicorn would serve, lifespan included, and the log
is read back from the store once the writer has flushed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from router.app.factory import Services, build_services, create_app
from router.app.settings import Settings
from router.http.keys import new_key
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from router.store import RequestRecord
from tests.unit.requestpath import BODIES

PATHS = {OPENAI_CHAT: "/v1/chat/completions", ANTHROPIC: "/v1/messages", OPENAI_RESPONSES: "/v1/responses"}
MASTER = "master-key-for-unit-tests-0123456789"


@dataclass
class Router:
    client: httpx.AsyncClient
    s: Services

    async def post(
        self, protocol: str = OPENAI_CHAT, *, key: str | None = None, headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> httpx.Response:  # fmt: skip
        sent = {**(headers or {})}
        if key is not None:
            sent["authorization"] = f"Bearer {key}"
        return await self.client.post(PATHS[protocol], json={**BODIES[protocol], **fields}, headers=sent)

    async def key(self, name: str = "agent", **limits: Any) -> tuple[str, str]:
        """A new virtual key with these limits: (the key, its id)."""
        key, rec = new_key(name, **limits)
        await self.s.store.create_key(rec)
        return key, rec.key_id

    async def records(self) -> list[RequestRecord]:
        """Every log row so far, oldest first."""
        await self.s.writer.flush()
        return await self.s.store.requests_since(0.0)


@asynccontextmanager
async def serving(
    tmp: Path, models: list[dict[str, Any]], *, policy: dict[str, Any] | None = None, **settings: Any
) -> AsyncIterator[Router]:
    """The router for a policy with ``models`` (all candidates for any requested name)."""
    ids = [m["id"] for m in models]
    spec = {"models": models, "routes": [{"match": "*", "candidates": ids}], **(policy or {})}
    config = tmp / "policy.yaml"
    config.write_text(yaml.safe_dump(spec))
    settings.setdefault("store", f"sqlite:///{tmp / 'log.db'}")
    s = build_services(Settings(config=config, **settings))
    app = create_app(services=s)
    async with (
        app.api.router.lifespan_context(app.api),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client,
    ):
        yield Router(client, s)
