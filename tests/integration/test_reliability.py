"""Defects found by hostile probing (issue 18), each through a real router and the fake upstream.

Money and data first: what a stream that ends early is billed, that the upstream is closed when
the client leaves, that failures are logged and reported truthfully, that budgets hold.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from router.app.cli import main
from router.app.factory import Services
from router.app.limits import Limits
from router.fakeupstream import FakeUpstream
from router.forward.timeouts import Timeouts
from router.shared import MemoryState, StateConfig
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_faults import HI, faulty, last
from tests.integration.test_keys import MASTER, create_key

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]
SLOW = Timeouts(connect=1.0, first_token=5.0, idle=5.0, overall=60.0)
FAST = Timeouts(connect=1.0, first_token=0.5, idle=0.5, overall=8.0)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def leave_after(r: RunningRouter, path: str, body: dict[str, Any], content_events: int) -> None:
    """Stream ``body`` and hang up after ``content_events`` content events."""
    seen = 0
    with httpx.stream("POST", r.url + path, json={**body, "stream": True}, timeout=20) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and ('"delta"' in line or "output_text.delta" in line):
                seen += 1
                if seen >= content_events:
                    return


def translated(model: str) -> pytest.MarkDecorator:
    """The two client protocols an OpenAI backend serves through litellm, asking for ``model``."""
    return pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/messages", {"model": model, "max_tokens": 100, "messages": HI}),
            ("/v1/responses", {"model": model, "input": "hi"}),
        ],
        ids=["anthropic", "responses"],
    )


@translated("solo")
def test_translated_stream_is_closed_and_billed_when_the_client_leaves(
    router_factory: Factory, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    # An OpenAI backend serving an Anthropic / Responses client goes through litellm.
    r = router_factory(faulty(upstream, "chunk_ms=250,chunks=40"), timeouts=SLOW)
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda _: leave_after(r, path, body, 3), range(20)))
    assert wait_for(lambda: upstream.open_streams() == 0, 1.0), "the upstream stream was left running"
    rec = last(r, 20)
    # Streamed or not, a client that left is logged 499 (item 13).
    assert rec["status"] == 499 and rec["error_type"] == "client_disconnected"
    assert rec["usage_estimated"] == 1
    assert rec["input_tokens"] > 0 and rec["output_tokens"] >= 3 and rec["cost_usd"] > 0


def test_anthropic_stream_cut_short_estimates_output(router_factory: Factory, upstream: FakeUpstream) -> None:
    # message_start says output_tokens=1; only message_delta has the real count.
    r = router_factory(faulty(upstream, "break_after=20,chunks=40", protocol="anthropic"), timeouts=FAST)
    with httpx.stream("POST", r.url + "/v1/messages", timeout=20,
                      json={"model": "solo", "max_tokens": 100, "messages": HI, "stream": True}) as resp:  # fmt: skip
        text = "".join(resp.iter_lines())
    assert "event: error" in text or '"type":"error"' in text.replace(" ", "")
    rec = last(r)
    assert rec["error_type"] == "UpstreamError"
    assert rec["usage_estimated"] == 1 and rec["output_tokens"] >= 20


@translated("auto")
def test_translated_call_to_a_hung_backend_falls_back(
    router_factory: Factory, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    # The backend answers after 3 s; the idle timeout is 0.5 s: the healthy backend must answer,
    # well before the hung one would have (the relay path does the same).
    r = router_factory(faulty(upstream, "ttft_ms=3000"), timeouts=FAST)
    started = time.monotonic()
    resp = httpx.post(r.url + path, json=body, timeout=20)
    assert resp.status_code == 200 and resp.headers["x-router-model"] == "good"
    assert time.monotonic() - started < 2.5
    tries = last(r)["tries"]
    assert tries[0]["model"] == "faulty" and tries[0]["error_type"] == "UpstreamTimeout"


def test_translated_stream_stalling_mid_way_names_the_idle_timeout(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    r = router_factory(faulty(upstream, "stall_after=2,stall_ms=4000,chunks=6"), timeouts=FAST)
    started = time.monotonic()
    with httpx.stream("POST", r.url + "/v1/messages", timeout=20,
                      json={"model": "solo", "max_tokens": 100, "messages": HI, "stream": True}) as resp:  # fmt: skip
        assert resp.status_code == 200
        text = "\n".join(resp.iter_lines())
    assert time.monotonic() - started < 3.0
    assert "event: error" in text and "idle timeout" in text
    assert last(r)["error_type"] == "UpstreamTimeout"


def test_a_stream_that_fails_before_its_first_token_logs_its_tries(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    r = router_factory(faulty(upstream, "status=500"), timeouts=FAST)
    resp = httpx.post(r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI, "stream": True},
                      timeout=20)  # fmt: skip
    assert resp.status_code == 502
    rec = last(r)
    assert rec["chosen_model"] == "faulty"
    # Each try's status is what the backend answered (the client got the router's 502).
    assert [(t["model"], t["status"]) for t in rec["tries"]] == [("faulty", 500), ("faulty", 500)]


@pytest.mark.parametrize(
    ("path", "body", "protocol"),
    [
        ("/v1/chat/completions", {"messages": HI}, "openai"),
        ("/v1/messages", {"max_tokens": 100, "messages": HI}, "anthropic"),
        ("/v1/messages", {"max_tokens": 100, "messages": HI}, "openai"),  # translated
    ],
    ids=["chat-relay", "anthropic-relay", "anthropic-translated"],
)
def test_malformed_sse_is_an_error_and_falls_back(
    router_factory: Factory, upstream: FakeUpstream, path: str, body: dict[str, Any], protocol: str
) -> None:
    # The backend's first content event is not JSON: nothing has reached the client yet.
    r = router_factory(faulty(upstream, "malformed=1", protocol=protocol), timeouts=SLOW)
    resp = httpx.post(r.url + path, json={**body, "model": "auto", "stream": True}, timeout=20)
    assert resp.status_code == 200 and resp.headers["x-router-model"] == "good"
    assert last(r)["tries"][0]["error_type"] == "UpstreamError"
    resp = httpx.post(r.url + path, json={**body, "model": "solo", "stream": True}, timeout=20)
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "not JSON" in message and "answered 500" not in message
    rec = last(r, 2)
    assert rec["status"] == 502 and rec["error_type"] == "UpstreamError"


def task_budget_policy(upstream: FakeUpstream, behaviour: str, budget: float) -> dict[str, Any]:
    policy = faulty(upstream, behaviour)
    policy["objective"] = {"max_cost_per_task": budget}
    return policy


def estimate(router_factory: Factory, upstream: FakeUpstream) -> float:
    r = router_factory(faulty(upstream, ""), timeouts=SLOW)
    assert (
        httpx.post(r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI}).status_code == 200
    )
    est: float = last(r)["cost_est_usd"]
    assert est > 0
    return est


def test_money_held_in_flight_is_a_429_with_retry_after(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    est = estimate(router_factory, upstream)
    # Room for four estimates: while four slow requests hold them, the rest must wait, not be
    # told the budget is spent (nothing has been spent yet).
    r = router_factory(task_budget_policy(upstream, "ttft_ms=1000", 4.5 * est), timeouts=SLOW)
    task = {"x-router-task-id": "held"}

    def call(_: int) -> httpx.Response:
        return httpx.post(r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI},
                          headers=task, timeout=20)  # fmt: skip

    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(call, range(12)))
    statuses = sorted(resp.status_code for resp in replies)
    assert statuses.count(200) >= 1 and 403 not in statuses, statuses
    held = [resp for resp in replies if resp.status_code == 429]
    assert held and all(resp.headers["retry-after"] == "1" for resp in held)
    assert held[0].json()["error"]["code"] == "budget_held"


def test_in_process_budgets_survive_a_restart(router_factory: Factory, upstream: FakeUpstream) -> None:
    est = estimate(router_factory, upstream)
    policy = task_budget_policy(upstream, "", 2 * est)
    task = {"x-router-task-id": "restart"}
    r = router_factory(policy, timeouts=SLOW)

    def call(router: RunningRouter) -> int:
        return httpx.post(router.url + "/v1/chat/completions", json={"model": "solo", "messages": HI},
                          headers=task, timeout=20).status_code  # fmt: skip

    statuses = []
    while 403 not in statuses:
        statuses.append(call(r))
        assert len(statuses) < 100
    r.stop()
    again = router_factory(policy, timeouts=SLOW, store=f"sqlite:///{r.db_path}")
    assert call(again) == 403, "the restarted router forgot what the task had spent"


def test_pruning_the_log_keeps_budgets(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """``router prune`` deletes old requests, and a router restarted on the pruned log still knows
    what each key and task had spent (in-process budgets restart from the log's spend)."""
    est = estimate(router_factory, upstream)
    policy = task_budget_policy(upstream, "", 2 * est)
    r = router_factory(policy, timeouts=SLOW, master_key=MASTER)
    key = create_key(r, capsys, "--name", "spender", "--budget", f"{3 * est:.10f}")
    store = f"sqlite:///{r.db_path}"

    def call(router: RunningRouter, task: str, as_key: str) -> int:
        return httpx.post(router.url + "/v1/chat/completions", json={"model": "solo", "messages": HI},
                          headers={"x-router-task-id": task, "x-api-key": as_key}, timeout=20).status_code  # fmt: skip

    statuses = []
    while 403 not in statuses:  # the task's budget: two estimates
        statuses.append(call(r, "old", key["key"]))
        assert len(statuses) < 100
    others = [call(r, "other", key["key"])]
    while others[-1] != 403:  # the key's: three
        others.append(call(r, "other", key["key"]))
        assert len(others) < 200, (statuses, others)
    r.stop()
    before = len(r._rows())
    capsys.readouterr()
    assert main(["prune", "--older-than", "0s", "--store", store]) == 0
    assert f"deleted {before} requests" in capsys.readouterr().out
    rows = r._rows()
    assert rows and all(row["endpoint"] == "(pruned)" for row in rows), rows
    assert len(rows) == 2  # one per (key, task) that spent anything

    again = router_factory(policy, timeouts=SLOW, store=store, master_key=MASTER)
    assert call(again, "new", key["key"]) == 403, "the key's spend was lost with the pruned rows"
    assert call(again, f"{key['key_id']}/old", MASTER) == 403, "the task's spend was lost"
    assert call(again, "fresh", MASTER) == 200


def test_tasks_belong_to_the_key_that_made_them(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    r = router_factory(local_policy(upstream.url), master_key=MASTER)
    one, two = create_key(r, capsys, "--name", "one"), create_key(r, capsys, "--name", "two")
    chat = {"model": "auto", "messages": HI}
    session = {"model": "claude-x", "max_tokens": 16, "messages": HI,
               "metadata": {"user_id": "user_abc_account__session_0f0e0d0c-1111-2222-3333-444455556666"}}  # fmt: skip
    with httpx.Client(base_url=r.url, timeout=20) as c:

        def as_key(made: dict[str, Any], **headers: str) -> dict[str, str]:
            return {"x-api-key": made["key"], **headers}

        first = c.post(
            "/v1/chat/completions", json=chat, headers=as_key(one, **{"x-router-task-id": "shared"})
        )
        assert first.status_code == 200
        echoed = first.headers["x-router-task-id"]
        # The other key names the same task: it gets a task of its own, not a way into the first.
        second = c.post(
            "/v1/chat/completions", json=chat, headers=as_key(two, **{"x-router-task-id": "shared"})
        )
        assert second.headers["x-router-task-id"] != echoed
        # Session ids the same way.
        s1 = c.post("/v1/messages", json=session, headers=as_key(one))
        s2 = c.post("/v1/messages", json=session, headers=as_key(two))
        assert s1.headers["x-router-task-id"] != s2.headers["x-router-task-id"]
        r.records(4)
        # Outcomes: another key's task is not found; its own is recorded.
        foreign = c.post("/v1/outcomes", json={"task_id": echoed, "success": True}, headers=as_key(two))
        assert foreign.status_code == 404
        own = c.post("/v1/outcomes", json={"task_id": "shared", "success": True}, headers=as_key(one))
        assert own.status_code == 200 and own.json()["task_id"] == echoed
        # Ledgers: a key reads its own; not another's; the master key reads any.
        assert c.get("/v1/tasks/shared", headers=as_key(one)).json()["task_id"] == echoed
        assert c.get(f"/v1/tasks/{echoed}", headers=as_key(two)).status_code == 404
        assert c.get(f"/v1/tasks/{echoed}", headers={"x-api-key": MASTER}).status_code == 200


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB filesystem of its own (a tmpfs: needs the right to mount, as root in a container)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_reported_and_the_log_recovers(
    small_disk: Path, router_factory: Factory, upstream: FakeUpstream
) -> None:
    db = small_disk / "log.db"
    r = router_factory(local_policy(upstream.url), store=f"sqlite:///{db}")

    def rows() -> int:
        con = sqlite3.connect(db)
        try:
            return int(con.execute("SELECT COUNT(*) FROM requests").fetchone()[0])
        finally:
            con.close()

    def ready() -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(r.url + "/readyz", timeout=5).json()
        return body

    chat = {"model": "auto", "messages": HI}
    assert httpx.post(r.url + "/v1/chat/completions", json=chat, timeout=20).status_code == 200
    assert wait_for(lambda: rows() == 1)
    free = os.statvfs(small_disk)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 16 * 1024))
    for _ in range(40):
        assert httpx.post(r.url + "/v1/chat/completions", json=chat, timeout=20).status_code == 200
    # The router still answers, and says its log is failing, with the store's own words.
    assert wait_for(lambda: ready()["status"] == "degraded", 10.0), ready()
    assert "full" in ready()["log_error"]
    filler.unlink()
    assert wait_for(lambda: rows() == 41, 20.0), "the log did not recover once space came back"
    assert wait_for(lambda: ready()["status"] == "ok", 10.0), ready()


TIGHT = Limits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=8)


def exchange(r: RunningRouter, data: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send raw bytes; return what came back before the server closed, and how long that took."""
    host, port = r.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got, time.monotonic() - started


def error_of(reply: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


@pytest.fixture
def limited(router_factory: Factory, upstream: FakeUpstream) -> RunningRouter:
    return router_factory(local_policy(upstream.url), limits=TIGHT)


REQUEST_LINE = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"


def test_huge_headers_are_refused(limited: RunningRouter) -> None:
    status, err = error_of(exchange(limited, REQUEST_LINE + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n")[0])
    assert status == 431 and f"{TIGHT.max_header_bytes} bytes" in err["message"]
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    status, err = error_of(exchange(limited, REQUEST_LINE + many + b"\r\n")[0])
    assert status == 431 and "headers" in err["message"]


def test_slow_headers_and_silent_connections_time_out(limited: RunningRouter) -> None:
    reply, took = exchange(limited, b"POST /v1/chat/completions HTTP/1.1\r\nHo")
    assert error_of(reply)[0] == 408 and took < 3
    reply, took = exchange(limited, b"")
    assert error_of(reply)[0] == 408 and took < 3


def test_a_body_that_stops_short_is_given_up(limited: RunningRouter) -> None:
    reply, took = exchange(limited, REQUEST_LINE + b'Content-Length: 1000\r\n\r\n{"model": ')
    assert reply == b"" and took < 3
    rec = last(limited)
    assert rec["status"] == 499 and rec["error_type"] == "client_disconnected"


def test_connections_are_capped(router_factory: Factory, upstream: FakeUpstream) -> None:
    # Held connections must outlive the test's probes: the default header timeout (10 s).
    limited = router_factory(local_policy(upstream.url), limits=Limits(max_connections=8))
    host, port = limited.url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(8)]
    try:
        probe = REQUEST_LINE + b"Connection: close\r\n\r\n"
        # Once the server has accepted the held ones, the next connection is refused.
        assert wait_for(lambda: error_of(exchange(limited, probe)[0])[0] == 503)
        status, err = error_of(exchange(limited, probe)[0])
        assert status == 503 and "connections" in err["message"]
    finally:
        for s in held:
            s.close()
    assert httpx.get(limited.url + "/healthz", timeout=5).status_code == 200


def test_malformed_http_and_wrong_methods_answer_in_the_protocol_shape(limited: RunningRouter) -> None:
    status, err = error_of(exchange(limited, b"NOT HTTP AT ALL\r\n\r\n")[0])
    assert status == 400 and err["type"] == "invalid_request_error"
    resp = httpx.get(limited.url + "/v1/chat/completions", timeout=5)
    assert resp.status_code == 405 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = httpx.get(limited.url + "/v1/messages", timeout=5)
    assert resp.status_code == 405 and resp.json()["type"] == "error"
    resp = httpx.get(limited.url + "/no/such/path", timeout=5)
    assert resp.status_code == 404 and "error" in resp.json()


def test_malformed_http_after_a_request_is_refused_without_a_traceback(
    limited: RunningRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that are not HTTP after a whole request on the same connection (a wrong
    Content-Length, a broken pipelining client): the parser's 400 went out and the connection was
    half-closed while the first request was still being answered, whose reply then failed to write
    ("Cannot call write() after write_eof()"): uvicorn's "Exception in ASGI application" traceback,
    at ERROR, for every such request a client sends (found by the hostile probe). The first
    request's reply is dropped (it can no longer come first); the 400 is all the client gets."""
    body = orjson.dumps({"model": "auto", "messages": HI})
    sent = REQUEST_LINE + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    # uvicorn's own loggers stop at "uvicorn" (its logging config): caught where they log.
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(caplog.handler)
    try:
        for _ in range(3):
            reply, _ = exchange(limited, sent + body + b"NOT HTTP AT ALL\r\n\r\n")
            status, err = error_of(reply)
            assert status == 400 and err["type"] == "invalid_request_error", reply
        assert wait_for(lambda: len(limited.records(wait_for=3)) >= 3)
        time.sleep(0.5)  # the first requests' replies are written (or not) after the 400s
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failures == [], [r.getMessage() for r in failures]
    assert httpx.get(limited.url + "/healthz", timeout=5).status_code == 200


def test_with_auth_on_only_health_and_metrics_are_open(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    r = router_factory(local_policy(upstream.url), master_key=MASTER)
    with httpx.Client(base_url=r.url, timeout=10) as c:
        for path in ("/v1/models", "/openapi.json"):
            refused = c.get(path)
            assert refused.status_code == 401 and refused.json()["error"]["type"]
            assert c.get(path, headers={"x-api-key": MASTER}).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        assert c.get("/metrics").status_code in (200, 404)  # 404: metrics not enabled, still no 401


def test_durable_log_stores_the_record_before_the_reply(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    r = router_factory(local_policy(upstream.url), durable_log=True)
    for i in range(5):
        resp = httpx.post(r.url + "/v1/chat/completions", json={"model": "auto", "messages": HI}, timeout=20)
        assert resp.status_code == 200
        # Read once, without waiting: with the batched writer the record comes up to 0.25 s later.
        ids = {row["request_id"] for row in r._rows()}
        assert resp.headers["x-request-id"] in ids, f"request {i}: answered before its record was stored"


def test_budgets_forgotten_for_room_start_again_from_the_log(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    est = estimate(router_factory, upstream)

    def two_scopes(s: Services) -> None:
        s.state = MemoryState(StateConfig(local_max_entries=2))  # the process remembers 2 scopes

    # Durable: each record is in the log before its reply, so the log is what was spent.
    r = router_factory(task_budget_policy(upstream, "", 2 * est), timeouts=SLOW, durable_log=True,
                       services_hook=two_scopes)  # fmt: skip

    def call(task: str) -> int:
        return httpx.post(r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI},
                          headers={"x-router-task-id": task}, timeout=20).status_code  # fmt: skip

    statuses: list[int] = []
    while 403 not in statuses:
        statuses.append(call("victim"))
        assert len(statuses) < 100
    for other in ("a", "b", "c"):  # push the victim's scope out
        assert call(other) == 200
    assert call("victim") == 403, "a task's spend was forgotten when its scope was evicted"


def _load_until_killed(
    tmp_path: Path, upstream: FakeUpstream, durable: bool, streams_only: bool = False
) -> tuple[list[tuple[str, float, bool]], float, Path]:
    """``router serve`` under load from six clients (half of the requests streamed, or all), then
    ``kill -9``; returns each answered request's id with when its client had the whole reply and
    whether it was streamed, the time of the kill, and the log's file."""
    from tests.integration.test_serve_process import free_port, wait_ready

    config, db, port = tmp_path / "policy.yaml", tmp_path / "kill.db", free_port()
    config.write_text(yaml.safe_dump(local_policy(upstream.url)))
    env = {**os.environ, "ROUTER_CONFIG": str(config), "ROUTER_STORE": f"sqlite:///{db}",
           "ROUTER_DURABLE_LOG": "1" if durable else "0"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "router.app.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    answered: list[tuple[str, float, bool]] = []
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(base_url=base, timeout=10) as c:
            i = 0
            while not stop.is_set():
                i += 1
                body = {"model": "auto", "messages": HI, "stream": streams_only or (n + i) % 2 == 0}
                try:
                    with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        r.read()
                        if r.status_code == 200 and (not body["stream"] or b"[DONE]" in r.content):
                            answered.append((r.headers["x-request-id"], time.time(), bool(body["stream"])))
                except httpx.HTTPError:
                    return

    try:
        wait_ready(base, proc)
        clients = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for t in clients:
            t.start()
        time.sleep(4.0)
        killed_at = time.time()
        proc.kill()
        proc.wait(timeout=10)
        stop.set()
        for t in clients:
            t.join(timeout=15)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return answered, killed_at, db


def _stored(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {row[0] for row in con.execute("SELECT request_id FROM requests")}
    finally:
        con.close()


def test_kill_9_loses_only_the_last_quarter_second(tmp_path: Path, upstream: FakeUpstream) -> None:
    """A hard crash loses only the records of requests answered in the last 0.25 s, under load too
    (writes start every 0.1 s). Records answered 0.3-0.55 s before the kill were lost here (1.2-1.5 s
    in the probe of issue 30): the writer waited its interval after each write ended."""
    upstream.clear()
    answered, killed_at, db = _load_until_killed(tmp_path, upstream, durable=False)
    assert len(answered) > 10, "too little load to judge"
    stored = _stored(db)
    lost = sorted((killed_at - t, rid) for rid, t, _ in answered if rid not in stored)
    assert not lost or lost[-1][0] <= 0.4, (  # 0.25 s, with room for a machine loaded many times over
        f"{len(lost)} of {len(answered)} lost, the oldest answered {lost[-1][0]:.2f} s before"
    )


def test_kill_9_in_durable_mode_loses_nothing_answered(tmp_path: Path, upstream: FakeUpstream) -> None:
    """``ROUTER_DURABLE_LOG=1``: every stream whose final event reached the client is in the log
    (a stream's record was written after its end, so a crash lost the last ones)."""
    upstream.clear()
    answered, _, db = _load_until_killed(tmp_path, upstream, durable=True, streams_only=True)
    assert len(answered) > 10, "too little load to judge"
    stored = _stored(db)
    lost = [(rid, stream) for rid, _, stream in answered if rid not in stored]
    assert not lost, f"{len(lost)} of {len(answered)} answered requests lost"
