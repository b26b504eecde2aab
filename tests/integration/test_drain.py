"""SIGTERM with a stream in flight: not ready at once, the stream finishes, the log is flushed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

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
