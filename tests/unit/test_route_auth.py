"""Every route but the open ones refuses a caller without a key: read off the app's routes, so a
route added without ``keyed`` (or the dashboard's login gate) fails here."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import yaml
from fastapi.routing import APIRoute

from router.app.asgi import RouterApp
from router.app.factory import create_app
from router.app.settings import Settings
from router.fakeupstream import FakeUpstream
from tests.unit.inprocess import MASTER
from tests.unit.requestpath import model

#: Open on purpose: probes for load balancers and scrapers, and the dashboard's way in and out.
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/ui/login"),
    ("POST", "/ui/login"),
    ("POST", "/ui/logout"),
}


@asynccontextmanager
async def served(tmp: Path, fake: FakeUpstream) -> AsyncIterator[tuple[RouterApp, httpx.AsyncClient]]:
    config = tmp / "policy.yaml"
    config.write_text(
        yaml.safe_dump({"models": [model("a", fake.url)], "routes": [{"match": "*", "candidates": ["a"]}]})
    )
    app = create_app(Settings(config=config, store=f"sqlite:///{tmp / 'log.db'}", master_key=MASTER))
    async with (
        app.api.router.lifespan_context(app.api),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client,
    ):
        yield app, client


def routes(app: RouterApp) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.api.routes if isinstance(r, APIRoute) for m in r.methods}


async def test_every_route_but_the_public_ones_refuses_without_a_key(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with served(tmp_path, fake) as (app, client):
        every = routes(app)
        assert PUBLIC.issubset(
            every
        )  # a public route renamed or gone would leave this list vouching for nothing
        checked = sorted(every - PUBLIC)
        assert len(checked) >= 15, checked
        for method, path in checked:
            url = re.sub(r"\{[^}]+\}", "x", path)
            for headers in ({}, {"authorization": "Bearer not-the-key"}):
                r = await client.request(
                    method, url, content=b"{}" if method == "POST" else None, headers=headers
                )
                if path.startswith("/ui"):  # the dashboard sends a browser to its login form instead
                    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login"), (
                        method,
                        path,
                    )
                else:
                    assert r.status_code == 401, (method, path, r.status_code, r.text)
                    assert r.json()["error"]["type"] in ("invalid_request_error", "authentication_error"), (
                        r.text
                    )


async def test_the_api_description_declares_path_parameters_and_not_the_caller(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # keyed() hides the handler's ``principal`` from FastAPI, which read it as a query parameter,
    # and keeps its other parameters, which the OpenAPI document (and schemathesis) need.
    async with served(tmp_path, fake) as (_, client):
        doc = (await client.get("/openapi.json", headers={"authorization": f"Bearer {MASTER}"})).json()
    params = {
        path: sorted(p["name"] for op in ops.values() for p in op.get("parameters", []))
        for path, ops in doc["paths"].items()
    }
    assert params["/v1/models/{model_id}"] == ["model_id"]
    assert params["/v1/tasks/{task_id}"] == ["task_id"]
    assert not [p for p, names in params.items() if "principal" in names or "self" in names]
    assert doc["paths"]["/v1/route"]["post"]["description"].startswith("The decision the proxy would make")
