"""Denial of service (issue 30): what one client can do to every other client of a real router.

Each test runs the hostile client beside a stall probe — ``/healthz`` asked over and over on its own
connection — and bounds the worst wait the probe saw, generously: a router that holds its event loop
for the hostile request stalls the probe for the whole of it (seconds), one that does not answers
it in milliseconds, even on a loaded machine.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]

#: The worst /healthz wait allowed while a hostile client is served. What each test provokes held
#: the loop for several times this before its fix.
STALL_S = 1.0


class Probe:
    """The worst latency of ``/healthz`` while the probe runs: how long the event loop was held."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.answers = 0


@contextmanager
def stall_probe(url: str) -> Iterator[Probe]:
    probe = Probe()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                started = time.monotonic()
                assert client.get("/healthz").status_code == 200
                probe.worst = max(probe.worst, time.monotonic() - started)
                probe.answers += 1
                stop.wait(0.01)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield probe
    finally:
        stop.set()
        thread.join(timeout=60)


def words(n_chars: int, seed: int = 0) -> str:
    """Text that tokenizes like prose (made-up words: no cache or dictionary shortcut)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out: list[str] = []
    size = 0
    while size < n_chars:
        word = "".join(rng.choices(letters, k=rng.randint(2, 9)))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


# -- item 9: exact token counts of a large prompt ------------------------------------------------

#: A prompt of ~8 MB: its bounds straddle every context window, so it is counted exactly before
#: deciding (seconds of tiktoken), and the body is well under the 32 MiB cap.
BIG = 8_000_000


def test_a_large_prompt_is_counted_off_the_event_loop(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    r = router_factory(local_policy(upstream.url))
    messages = [{"role": "user", "content": words(BIG)}]
    # The proxy, the route preview and Anthropic's count_tokens all count it exactly.
    for path, body in [
        ("/v1/chat/completions", {"model": "auto", "max_tokens": 10}),
        ("/v1/route", {"model": "auto"}),
        ("/v1/messages/count_tokens", {"model": "auto"}),
    ]:
        with stall_probe(r.url) as probe:
            time.sleep(0.2)
            resp = httpx.post(r.url + path, json={**body, "messages": messages}, timeout=120)
            time.sleep(0.2)
        # Answered (a prompt that no window holds is a 400), not failed.
        assert resp.status_code in (200, 400), (path, resp.text[:300])
        assert probe.answers > 5, path
        assert probe.worst < STALL_S, (
            f"{path}: /healthz waited {probe.worst:.2f}s while a large prompt was counted"
        )


# -- item 11: the body of POST /v1/outcomes ------------------------------------------------------


def test_an_outcome_body_over_the_cap_is_a_413(router_factory: Factory, upstream: FakeUpstream) -> None:
    r = router_factory(local_policy(upstream.url), max_body_bytes=1 << 20)
    outcome = {"task_id": "t", "success": True, "details": {"note": "x" * (2 << 20)}}
    resp = httpx.post(r.url + "/v1/outcomes", json=outcome, timeout=30)
    assert resp.status_code == 413, resp.text[:300]
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and f"{1 << 20} bytes" in err["message"]


# -- item 10: a task of many requests ------------------------------------------------------------

#: Requests of one task in the log: its ledger and an outcome on it read them.
TASK_ROWS = 20_000


def many_requests(r: RunningRouter, task: str, n: int) -> None:
    """``n`` copies of one real logged request of ``task``, written to the router's SQLite log."""
    resp = httpx.post(r.url + "/v1/chat/completions", headers={"x-router-task-id": task}, timeout=30,
                      json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert resp.status_code == 200
    row = r.records(1)[-1]
    columns = list(row)
    con = sqlite3.connect(r.db_path, timeout=30)
    try:
        copies = [
            tuple(f"{row['request_id']}-{i}" if c == "request_id" else row["ts"] - i if c == "ts" else row[c]
                  for c in columns)
            for i in range(1, n)
        ]  # fmt: skip
        con.executemany(
            f"INSERT INTO requests ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", copies
        )
        con.commit()
    finally:
        con.close()


def test_a_task_of_many_requests_stalls_no_one(router_factory: Factory, upstream: FakeUpstream) -> None:
    # The ledger reads the latest 5,000 requests (the dashboard's cap, ROUTER_MAX_WINDOW_REQUESTS).
    r = router_factory(local_policy(upstream.url), max_window_requests=5_000)
    many_requests(r, "long", TASK_ROWS)
    with stall_probe(r.url) as probe:
        time.sleep(0.2)
        ledger = httpx.get(r.url + "/v1/tasks/long", timeout=120)
        outcome = httpx.post(r.url + "/v1/outcomes", json={"task_id": "long", "success": False}, timeout=120)
        time.sleep(0.2)
    assert ledger.status_code == 200, ledger.text[:300]
    assert ledger.json()["capped"] == 5_000 and ledger.json()["requests"] == 5_000
    assert outcome.status_code == 200, outcome.text[:300]
    assert probe.answers > 5
    assert probe.worst < STALL_S, f"/healthz waited {probe.worst:.2f}s while a long task was read"
