"""`router serve` as a real process: flags and env, SDK traffic, clean shutdown with the log flushed."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import local_policy

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "router serve did not become ready"
        time.sleep(0.2)


def serve_process(tmp_path: Path, upstream: FakeUpstream, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """``router serve FLAGS`` on the demo policy, a free port and ``tmp_path/serve.db``; returns once
    it is ready (the caller stops it)."""
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(local_policy(upstream.url)))
    port = free_port()
    env = {**os.environ, "ROUTER_CONFIG": str(config), "ROUTER_STORE": f"sqlite:///{tmp_path / 'serve.db'}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.app.cli", "serve", "--port", str(port), *flags],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, base


def test_router_serve_process(tmp_path: Path, upstream: FakeUpstream) -> None:
    db = tmp_path / "serve.db"
    proc, base = serve_process(tmp_path, upstream, "--log-level", "warning")
    try:
        c = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=20)
        text = "".join(
            ch.choices[0].delta.content or ""
            for ch in c.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            if ch.choices
        )
        assert "nano-model" in text
        assert {m.id for m in c.models.list()} >= {"auto", "local-nano", "local-claude"}
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status tells why.
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "OPEN MODE" in out
    assert "Traceback" not in out
    con = sqlite3.connect(db)
    rows = con.execute("SELECT chosen_model, status, output_tokens FROM requests").fetchall()
    con.close()
    assert rows == [("local-nano", 200, rows[0][2])] and rows[0][2] > 0


def test_bad_config_fails_at_startup_with_the_field_path(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "models:\n  - id: a\n    litellm_model: openai/a\n    protocol: openai\n    colour: red\nroutes: []\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "router.app.cli", "serve", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{config}: models[0] (id 'a').colour: unknown field" in proc.stderr
    assert "Traceback" not in proc.stderr
