"""Real servers on 127.0.0.1: the local fake provider, and the router under uvicorn; what a refusal of
the router must look like."""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml

from router.app.factory import Services, build_services, create_app
from router.app.serve import uvicorn_config
from router.app.settings import Settings
from router.fakeupstream import FakeUpstream
from tests.integration.agentkit import install_npm_agents


@pytest.fixture(scope="session")
def npm_agents() -> Path:
    """``bin`` of the npm coding agents (Claude Code, Codex CLI, opencode, Qwen Code), installed once."""
    return install_npm_agents()


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


def local_policy(upstream_url: str, **overrides: Any) -> dict[str, Any]:
    """The demo policy (policies/examples/local.yaml) pointed at a test upstream."""
    text = (Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_text()
    policy = yaml.safe_load(text.replace("${ROUTER_LOCAL_UPSTREAM:-http://127.0.0.1:9100}", upstream_url))
    # The demo explores; tests want the policy's own choice every time.
    policy["objective"]["exploration"] = {"epsilon": 0.0}
    policy.update(overrides)
    return policy


@dataclass
class RunningRouter:
    url: str
    db_path: Path
    server: uvicorn.Server
    thread: threading.Thread

    def records(self, wait_for: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Log rows, oldest first, once at least ``wait_for`` have been written (the writer batches)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self._rows()
            if len(rows) >= wait_for or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)

    def _rows(self) -> list[dict[str, Any]]:
        if not self.db_path.exists():
            return []
        con = sqlite3.connect(self.db_path)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute("SELECT * FROM requests ORDER BY ts")]
        except sqlite3.OperationalError:
            return []
        finally:
            con.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_router(
    policy: dict[str, Any],
    tmp: Path,
    *,
    services_hook: Callable[[Services], None] | None = None,
    **settings: Any,
) -> RunningRouter:
    """``services_hook`` may replace parts of the services (say, telemetry) before the app is built."""
    config = settings.pop("config", None)  # replicas may share one policy file
    if config is None:
        config = tmp / "policy.yaml"
        config.write_text(yaml.safe_dump(policy))
    db = tmp / "log.db"
    store = settings.pop("store", f"sqlite:///{db}")
    services = build_services(Settings(config=config, store=store, **settings))
    if services_hook is not None:
        services_hook(services)
    app = create_app(services=services)
    # Served as `router serve` serves it: with its limits on clients.
    uv_config = uvicorn_config(app, services.settings, log_level="warning", lifespan="on")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("router did not start")
        time.sleep(0.02)
    # litellm and the tokenizer load after the start (the first time in this process: seconds,
    # more on a busy machine); tests of timeouts and phases must not time their loading.
    deadline = time.monotonic() + 180
    while not (services.upstream.translation_ready and services.counter.loaded):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the router's translation (litellm) did not load")
        time.sleep(0.02)
    return RunningRouter(f"http://127.0.0.1:{port}", db, server, thread)


@contextmanager
def serving(policy: dict[str, Any], tmp: Path, **settings: Any) -> Iterator[RunningRouter]:
    """``start_router`` for a ``with`` block (a module's fixture: one server for many cases)."""
    r = start_router(policy, tmp, **settings)
    try:
        yield r
    finally:
        r.stop()


#: The paths that answer in Anthropic's shape; every other path, the router's own too, in OpenAI's.
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def assert_protocol_shaped(status: int, text: str, path: str) -> None:
    """No traceback and no 5xx; a refusal (4xx) in the protocol's own error shape: Anthropic's
    ``{"type": "error", "error": {...}}`` on its paths, else OpenAI's ``{"error": {...}}``, the error
    with a type and a message, both non-empty strings."""
    assert "Traceback" not in text and 'File "' not in text, text[:2000]
    assert status < 500, (status, text[:2000])
    if status < 400:
        return
    body = json.loads(text)
    if path in ANTHROPIC_PATHS:
        assert body.get("type") == "error", body
    else:
        assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("type"), str) and err["type"], body
    assert isinstance(err.get("message"), str) and err["message"].strip(), body


@pytest.fixture
def router_factory(tmp_path: Path) -> Iterator[Callable[..., RunningRouter]]:
    started: list[RunningRouter] = []

    def make(
        policy: dict[str, Any], *, services_hook: Callable[[Services], None] | None = None, **settings: Any
    ) -> RunningRouter:
        sub = tmp_path / f"r{len(started)}"
        sub.mkdir()
        r = start_router(policy, sub, services_hook=services_hook, **settings)
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()


@pytest.fixture
def router(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> RunningRouter:
    upstream.clear()
    return router_factory(local_policy(upstream.url))
