"""Denial of service (issue 30): what one client can do to every other client of a real router.

Each test runs the hostile client beside a stall probe — ``/healthz`` asked over and over on its own
connection — and bounds the worst wait the probe saw, generously: a router that holds its event loop
for the hostile request stalls the probe for about as long as the request takes (seconds), one that
does not answers it in a small part of that. A machine loaded by other work slows both alike, so the
bound is half of the hostile request's own time (0.5 s at least), not a fixed figure.
"""

from __future__ import annotations

import contextlib
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import orjson
import pytest

from router.app.limits import Limits
from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_keys import MASTER

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]


class Probe:
    """The worst latency of ``/healthz`` while the probe runs: how long the event loop was held."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.answers = 0

    def assert_not_held(self, took: float, what: str) -> None:
        """The loop was held for less than half of ``took``, the hostile request's time (0.5 s at least)."""
        assert self.answers > 5, what
        assert self.worst < max(0.5, took / 2), (
            f"{what}: the probe waited {self.worst:.2f}s (it took {took:.2f}s)"
        )


def healthz(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200


@contextmanager
def stall_probe(url: str, ask: Callable[[httpx.Client], None] = healthz) -> Iterator[Probe]:
    """``ask`` (``/healthz`` unless said) over and over on a connection of its own."""
    probe = Probe()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                started = time.monotonic()
                ask(client)
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
            started = time.monotonic()
            resp = httpx.post(r.url + path, json={**body, "messages": messages}, timeout=120)
            took = time.monotonic() - started
            time.sleep(0.2)
        # Answered (a prompt that no window holds is a 400), not failed.
        assert resp.status_code in (200, 400), (path, resp.text[:300])
        probe.assert_not_held(took, f"{path}, a large prompt")


# -- a body of many small JSON values, parsed and sized -------------------------------------------


def small_streamed_chat(client: httpx.Client) -> None:
    """Another client's request, streamed: served, whole, to its last event."""
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert b"[DONE]" in b"".join(resp.iter_bytes())


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/route", "/v1/messages/count_tokens"])
def test_a_body_of_many_small_values_is_parsed_and_sized_off_the_event_loop(
    router_factory: Factory, upstream: FakeUpstream, path: str
) -> None:
    """200,000 messages (9 MB): their parse and their sizing took seconds, all of it on the event loop,
    and every other client's stream waited for as long (found by the hostile probe; 20-30 MB of
    tools or messages held the others 1.5-8 s). Now a thread of its own does both, for the
    proxy and for the endpoints that read a body as it does (they parsed it on the loop still)."""
    r = router_factory(local_policy(upstream.url))
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"} for i in range(200_000)
    ]
    raw = orjson.dumps({"model": "auto", "max_tokens": 10, "messages": messages})
    assert len(raw) > 8_000_000
    with stall_probe(r.url, small_streamed_chat) as probe:
        time.sleep(0.2)
        started = time.monotonic()
        resp = httpx.post(r.url + path, content=raw, timeout=120,
                          headers={"content-type": "application/json"})  # fmt: skip
        took = time.monotonic() - started
        time.sleep(0.2)
    assert resp.status_code in (200, 400), resp.text[:300]  # a prompt no window holds is a 400
    probe.assert_not_held(took, "200,000 messages")


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
        started = time.monotonic()
        ledger = httpx.get(r.url + "/v1/tasks/long", timeout=120)
        outcome = httpx.post(r.url + "/v1/outcomes", json={"task_id": "long", "success": False}, timeout=120)
        took = time.monotonic() - started
        time.sleep(0.2)
    assert ledger.status_code == 200, ledger.text[:300]
    assert ledger.json()["capped"] == 5_000 and ledger.json()["requests"] == 5_000
    assert outcome.status_code == 200, outcome.text[:300]
    probe.assert_not_held(took, "a ledger and an outcome of a long task")


# -- item 8: bodies trickled byte by byte, and what follows a refusal ----------------------------


def connect(r: RunningRouter) -> socket.socket:
    host, port = r.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def trickle(s: socket.socket, stop: threading.Event, every_s: float) -> None:
    """A byte of body every ``every_s`` seconds until ``stop`` or the server closes."""
    with contextlib.suppress(OSError):
        while not stop.wait(every_s):
            s.sendall(b" ")


def read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """What the server sent until it closed the connection (or ``timeout``), and how long that took."""
    started = time.monotonic()
    got = b""
    s.settimeout(timeout)
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            got += chunk
            s.settimeout(max(0.01, timeout - (time.monotonic() - started)))
    return got, time.monotonic() - started


BODY_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


def test_trickled_bodies_are_cut_and_free_their_connections(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    # A byte every 0.3 s is never silent for the body timeout (1 s), and far below the minimum rate.
    r = router_factory(local_policy(upstream.url), limits=Limits(body_timeout_s=1.0, max_connections=8))
    stop = threading.Event()
    held = [connect(r) for _ in range(8)]
    threads = []
    try:
        for s in held:
            s.sendall(BODY_HEAD + b"Content-Length: 100000\r\n\r\n{")
            threads.append(threading.Thread(target=trickle, args=(s, stop, 0.3), daemon=True))
            threads[-1].start()
        # Every slot is taken by a trickle; another client is served once they are cut.
        started = time.monotonic()
        status = 0
        while status != 200 and time.monotonic() - started < 20:
            with contextlib.suppress(httpx.HTTPError):
                status = httpx.get(r.url + "/healthz", timeout=5).status_code
            time.sleep(0.2)
        assert status == 200, "trickled bodies held every connection"
        for s in held:
            assert read_until_closed(s, 10)[1] < 10, "a trickled body held its connection"
    finally:
        stop.set()
        for s in held:
            s.close()


def test_an_auth_failure_closes_the_connection(router_factory: Factory, upstream: FakeUpstream) -> None:
    r = router_factory(local_policy(upstream.url), master_key=MASTER)
    stop = threading.Event()
    with connect(r) as s:
        s.sendall(BODY_HEAD + b"Content-Length: 100000\r\n\r\n{")
        threading.Thread(target=trickle, args=(s, stop, 0.3), daemon=True).start()
        try:
            # The default limits: 30 s of silence, 75 s of keep-alive; a byte every 0.3 s is neither.
            reply, took = read_until_closed(s, 15)
        finally:
            stop.set()
    head = reply.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 401") and b"connection: close" in head, reply[:300]
    assert took < 10, f"the connection stayed open {took:.1f}s after its 401"


def test_a_reply_before_the_body_says_the_connection_closes(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """Any reply sent before the request's body is in closes the connection after it, so it must
    say so: a client told nothing reused the connection for its next request and got a disconnect
    (a cross-site form post's 403, then the next post from the same client, seen in CI)."""
    r = router_factory(local_policy(upstream.url), master_key=MASTER)
    with connect(r) as s:
        s.sendall(
            b"POST /ui/login HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nkey="
        )
        reply, took = read_until_closed(s, 15)
    head = reply.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 403"), reply[:300]
    assert b"connection: close" in head, f"closed after a reply that did not say so: {head!r}"
    assert took < 10


@pytest.mark.parametrize("connection", [b"", b"Connection: close\r\n"], ids=["keep-alive", "close"])
def test_a_413_reaches_a_client_still_sending(
    router_factory: Factory, upstream: FakeUpstream, connection: bytes
) -> None:
    r = router_factory(local_policy(upstream.url), max_body_bytes=1 << 20)
    with connect(r) as s:
        # Refused by its Content-Length; the client sends it whole before it reads, as most do.
        s.sendall(BODY_HEAD + connection + b"Content-Length: %d\r\n\r\n" % (64 << 20))
        try:
            for _ in range(1024):
                s.sendall(b"x" * 65536)
        except OSError as exc:
            raise AssertionError(f"the connection was reset while the client sent: {exc!r}") from None
        reply, took = read_until_closed(s, 15)
    head = reply.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 413"), f"no 413 (a reset?): {reply[:100]!r}"
    assert b"connection: close" in head and took < 10
