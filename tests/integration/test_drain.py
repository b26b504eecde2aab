"""SIGTERM with a stream in flight: not ready at once, the stream finishes, the log is flushed.

And shutdown waits for what is in flight, not for litellm's import (seconds at start, tens under
load): the tests make that import as slow as they like with a launcher that holds it back.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import local_policy
from tests.integration.test_serve_process import free_port, wait_ready
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def test_sigterm_drains_in_flight_stream(tmp_path: Path, upstream: FakeUpstream) -> None:
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@chunks=12,chunk_ms=250"
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(policy))
    port, db = free_port(), tmp_path / "drain.db"
    env = {**os.environ, "ROUTER_STORE": f"sqlite:///{db}", "ROUTER_DRAIN_DELAY": "1.0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.app.cli", "serve", "--config", str(config), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        frames: list[str] = []

        def stream() -> None:
            body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():  # one by one: the test watches the stream get under way
                    if line.startswith("data: "):
                        frames.append(line)

        t = threading.Thread(target=stream)
        t.start()
        wait_for(lambda: len(frames) >= 2, what="the stream under way")  # 12 chunks, 250 ms apart
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(base + "/readyz", timeout=5).status_code == 503, what="draining")
        t.join(timeout=30)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert frames and frames[-1] == "data: [DONE]", frames[-3:]
    assert proc.returncode in (0, -signal.SIGTERM), out
    con = sqlite3.connect(db)
    rows = con.execute("SELECT status, error_type, output_tokens FROM requests").fetchall()
    con.close()
    assert rows == [(200, None, rows[0][2])] and rows[0][2] > 0


#: ``python LAUNCHER ARGS``: ``router ARGS`` with litellm's import held back SLOW_IMPORT_S seconds
#: (its module runs late; finding it, as the price map does at start, is not held back).
LAUNCHER = """
import importlib.abc, importlib.machinery, os, sys, time

class SlowLitellm(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path) if name == "litellm" else None
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module
            def exec_module(module):
                time.sleep(float(os.environ["SLOW_IMPORT_S"]))
                run(module)
            spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, SlowLitellm())
from router.app.cli import main
sys.exit(main())
"""


def slow_import_serve(
    tmp_path: Path, upstream: FakeUpstream, port: int, slow_s: float, policy: dict[str, Any] | None = None,
    **env_extra: str,
) -> subprocess.Popen[bytes]:  # fmt: skip
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(policy or local_policy(upstream.url)))
    env = {**os.environ, "ROUTER_STORE": f"sqlite:///{tmp_path / 'log.db'}", "ROUTER_DRAIN_DELAY": "0",
           "SLOW_IMPORT_S": str(slow_s), **env_extra}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, str(launcher), "serve", "--config", str(config), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def in_flight(base: str) -> float:
    metrics = httpx.get(base + "/metrics", timeout=5).text.splitlines()
    return float(next(line.split()[-1] for line in metrics if line.startswith("router_inflight_requests ")))


def test_sigterm_does_not_wait_for_litellm_to_load(tmp_path: Path, upstream: FakeUpstream) -> None:
    # Shutdown waited for the background import: ROUTER_DRAIN_TIMEOUT (30 s) in the drain, then
    # asyncio.run's join of the executor thread until the import was done (here: 10 minutes).
    port = free_port()
    proc = slow_import_serve(tmp_path, upstream, port, 600)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()["translation_loaded"] is False
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=20)[0].decode()  # about a second here
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out and "cancelling" not in out, out


def test_a_port_taken_exits_at_once(tmp_path: Path, upstream: FakeUpstream) -> None:
    # The bind error was printed at once, then the exit waited for litellm's import (13 s seen).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = slow_import_serve(tmp_path, upstream, taken.getsockname()[1], 600)
        try:
            out = proc.communicate(timeout=30)[0].decode()  # startup included
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode not in (0, None) and "address already in use" in out, out


def test_a_translated_request_in_flight_at_sigterm_still_waits_for_litellm(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    # What drains is what is in flight: a request that needs litellm waits for it, then is answered.
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = slow_import_serve(tmp_path, upstream, port, 3)
    replies: list[httpx.Response] = []
    try:
        wait_ready(base, proc)
        # local-claude speaks Anthropic: a Chat Completions request to it is translated.
        body = {"model": "local-claude", "messages": [{"role": "user", "content": "hi"}]}
        t = threading.Thread(
            target=lambda: replies.append(httpx.post(base + "/v1/chat/completions", json=body, timeout=60))
        )
        t.start()
        wait_for(lambda: in_flight(base) == 1, what="the request in flight")
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=60)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert replies and replies[0].status_code == 200, (replies[0].text if replies else None, out)
    assert replies[0].headers["x-router-model"] == "local-claude"
    assert proc.returncode in (0, -signal.SIGTERM), out


def test_while_litellm_loads_a_relayed_candidate_answers_and_a_translated_call_waits(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Issue 30 #13: for 10-23 s after each start, a translated call waited for litellm's import
    inside its first-token timeout (504 after 15 s) although a relayed candidate was at hand. Now
    the relayed candidate answers at once, and a call only a translation can serve waits for the
    load as queue time, not as the backend's first-token time."""
    policy = local_policy(upstream.url)
    policy["rules"].append({"name": "claude-first", "when": {"stream": False}, "prefer": ["local-claude"]})
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = slow_import_serve(tmp_path, upstream, port, 6, policy, ROUTER_TIMEOUTS__FIRST_TOKEN="2")
    try:
        wait_ready(base, proc)
        hi = [{"role": "user", "content": "hi"}]
        began = time.monotonic()
        relayed = httpx.post(
            base + "/v1/chat/completions", json={"model": "auto", "messages": hi}, timeout=30
        )
        fell_back_in = time.monotonic() - began
        assert httpx.get(base + "/readyz", timeout=5).json()["translation_loaded"] is False
        body = {"model": "local-claude", "stream": True, "messages": hi}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
            translated = (r.status_code, r.headers.get("x-router-model"), [x for x in r.iter_lines() if x])
        after = httpx.post(base + "/v1/chat/completions", json={"model": "auto", "messages": hi}, timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=20)
    assert relayed.status_code == 200 and relayed.headers["x-router-model"] == "local-nano", relayed.text
    assert fell_back_in < 4, fell_back_in
    assert translated[:2] == (200, "local-claude") and translated[2][-1] == "data: [DONE]", translated
    assert after.headers["x-router-model"] == "local-claude"  # loaded: the decision's own order again
