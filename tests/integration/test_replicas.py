"""Two replicas sharing one Redis and one PostgreSQL, including the fault cases.

Redis and PostgreSQL are the machine's real servers; each test uses its own Redis key prefix and
its own PostgreSQL schema. Outages are played by a TCP relay in front of the shared server
(``TcpProxy``), so stopping "Redis" or "PostgreSQL" here never disturbs anything else.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
import yaml

from router.fakeupstream import FakeUpstream
from router.learning.training import dataset
from router.learning.training.fit import fit
from router.rollout.promote import promote
from router.shared.redis_keys import Keys
from tests.integration.conftest import local_policy
from tests.integration.tcpproxy import TcpProxy
from tests.polling import wait_for

pytestmark = pytest.mark.integration

REDIS_PORT = int(os.environ.get("ROUTER_TEST_REDIS_PORT", "6379"))
PG = os.environ.get("ROUTER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
CHAT = "/v1/chat/completions"


def body(text: str = "hi") -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}]}


@pytest.fixture
def pg_schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield name
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def pg_url(schema: str, port: int = 5432) -> str:
    base = PG.replace(":5432/", f":{port}/")
    return f"{base}?options=-csearch_path%3D{schema}"


def pg_rows(schema: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url(schema)) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def pair(pg_schema: str, router_factory, upstream: FakeUpstream, tmp_path: Path):  # type: ignore[no-untyped-def]
    # pg_schema comes first so that it is dropped after the routers have stopped and flushed.
    """Two replicas, one policy file, one Redis prefix, one PostgreSQL schema."""

    def make(
        policy: dict[str, Any] | None = None, redis_port: int = REDIS_PORT, pg_port: int = 5432, **kw: Any
    ):  # type: ignore[no-untyped-def]
        config = tmp_path / "shared-policy.yaml"
        config.write_text(yaml.safe_dump(policy or local_policy(upstream.url)))
        common = dict(config=config, store=pg_url(pg_schema, pg_port), redis_url=f"redis://127.0.0.1:{redis_port}/0",
                      redis_prefix=f"test:{uuid.uuid4().hex[:8]}:", **kw)  # fmt: skip
        return router_factory({}, **common), router_factory({}, **common), config

    return make


def test_pin_made_on_a_holds_on_b(pair, pg_schema: str) -> None:  # type: ignore[no-untyped-def]
    a, b, _ = pair()
    task = {"x-router-task-id": f"task-{uuid.uuid4().hex[:8]}"}
    # The premium header makes A start the task on local-large ...
    r1 = httpx.post(a.url + CHAT, json=body(), headers={**task, "x-router-tier": "premium"}, timeout=20)
    assert r1.headers["x-router-model"] == "local-large"
    # The pin is shared off the request path: wait until it is in Redis.
    prefix = a.server.config.app.state.services.settings.redis_prefix
    pin_key = Keys(prefix).pin(r1.headers["x-router-task-id"])
    with redis.Redis(port=REDIS_PORT) as shared:
        wait_for(lambda: shared.get(pin_key) == b"local-large", what="the pin in Redis")
    # ... and B keeps it there, though on its own B would pick the cheapest (local-nano).
    r2 = httpx.post(b.url + CHAT, json=body("next"), headers=task, timeout=20)
    assert r2.headers["x-router-model"] == "local-large"
    assert httpx.post(b.url + CHAT, json=body(), timeout=20).headers["x-router-model"] == "local-nano"
    deadline = time.monotonic() + 10
    while len(pg_rows(pg_schema, "SELECT request_id FROM requests")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = pg_rows(
        pg_schema, f"SELECT chosen_model FROM requests WHERE task_id = '{task['x-router-task-id']}'"
    )
    assert sorted(r[0] for r in rows) == ["local-large", "local-large"]


def test_200_concurrent_requests_never_overspend_a_task_budget(pair, upstream, pg_schema: str) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    budget = 0.002
    policy["objective"] = {"max_cost_per_task": budget}
    # Both replicas, the upstream and 32 client threads share one process and its GIL here, so an
    # event loop can stall for a while: give Redis calls room, or an overloaded test machine
    # would look like a Redis outage (and budgets rightly fail closed).
    a, b, _ = pair(policy, redis_timeout_s=5.0)
    task = {"x-router-task-id": f"budget-{uuid.uuid4().hex[:8]}"}
    big = "word " * 2000  # ~2k tokens: ~$0.0001 a call on local-nano, ~$0.0005 reserved (estimate)

    def call(i: int) -> int:
        # As a client should: a 429 (money held by requests in flight) is retried after Retry-After,
        # so the task's spend, not the machine's speed, decides when the 403s come.
        target = a if i % 2 else b
        for _ in range(60):
            resp = httpx.post(target.url + CHAT, json=body(big), headers=task, timeout=30)
            if resp.status_code != 429:
                return resp.status_code
            time.sleep(float(resp.headers["retry-after"]))
        return 429

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(call, range(200)))
    # 403 once the spend itself leaves no room: never more than the budget, whatever the concurrency.
    assert set(statuses) <= {200, 403}
    assert statuses.count(403) > 0 and statuses.count(200) > 0
    deadline = time.monotonic() + 15
    while len(pg_rows(pg_schema, "SELECT 1 FROM requests")) < len(statuses) and time.monotonic() < deadline:
        time.sleep(0.2)
    spent = pg_rows(
        pg_schema,
        f"SELECT SUM(cost_usd) FROM requests WHERE status = 200 AND task_id = '{task['x-router-task-id']}'",
    )
    assert spent[0][0] <= budget, spent
    refused = pg_rows(pg_schema, "SELECT status, error_type FROM requests WHERE status IN (403, 429)")
    assert {tuple(r) for r in refused} <= {(403, "BudgetExceeded"), (429, "RateLimited")}


def synthetic_artifact(path: Path) -> None:
    """A tiny trained artifact: 'large' succeeds, 'local-nano' does not."""
    from router.features.task.vector import task_vector

    vec = task_vector("fix the race condition")
    rows = [
        dataset.AttemptRow(f"t{i}", 1, model, vec, model == "local-large", "explicit", 0.01, 3, 1.0, [model])
        for i in range(12)
        for model in ("local-nano", "local-large")
    ]

    path.write_bytes(fit(rows).to_json())


def test_policy_promoted_on_a_is_used_by_b_within_a_second(pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b, config = pair()
    artifact = tmp_path / "learned.json"
    synthetic_artifact(artifact)
    route_body = {"model": "auto", "tools": [{"type": "function", "function": {"name": "bash"}}],
                  "messages": [{"role": "user", "content": "fix the race condition"}]}  # fmt: skip
    assert "learned" not in httpx.post(b.url + "/v1/route", json=route_body).json()["policy"]
    started = time.monotonic()
    promote(str(artifact), str(config), f"redis://127.0.0.1:{REDIS_PORT}/0",
            a.server.config.app.state.services.settings.redis_prefix, force=True)  # two of the four models  # fmt: skip
    while "learned" not in httpx.post(b.url + "/v1/route", json=route_body).json()["policy"]:
        assert time.monotonic() - started < 1.5, "B did not pick up the promoted policy"
        time.sleep(0.05)
    assert httpx.post(b.url + "/v1/route", json=route_body).json()["chosen"] == "local-large"


def test_router_promote_tells_the_replicas_of_its_redis_prefix(
    tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`router promote --redis` published under the default prefix (`router:`) whatever
    ROUTER_REDIS_PREFIX said, as `router rollback` did not: replicas of another prefix never heard
    it (they reloaded at their next poll of the file) and a deployment on the default prefix was
    told of a policy not its own."""
    from router.app.cli import main

    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(local_policy(upstream.url)))
    artifact = tmp_path / "learned.json"
    synthetic_artifact(artifact)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    keys = Keys(prefix)
    monkeypatch.setenv("ROUTER_REDIS_PREFIX", prefix)
    url = f"redis://127.0.0.1:{REDIS_PORT}/0"
    with redis.Redis(port=REDIS_PORT) as shared, shared.pubsub() as sub:
        sub.subscribe(keys.policy_channel)
        assert sub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        try:
            assert main(["promote", str(artifact), "--config", str(config), "--redis", url, "--force"]) == 0
            message = sub.get_message(ignore_subscribe_messages=True, timeout=5)
            assert message is not None, f"nothing published on {keys.policy_channel}"
            assert shared.get(keys.policy_version) == message["data"]
        finally:
            shared.delete(keys.policy_version)


def test_redis_outage_fails_budgets_closed_and_the_rest_open(pair, upstream, router_factory) -> None:  # type: ignore[no-untyped-def]
    proxy = TcpProxy(REDIS_PORT).start()
    policy = local_policy(upstream.url)
    policy["objective"] = {"max_cost_per_task": 1.0}
    a, _, _ = pair(policy, redis_port=proxy.port)
    assert httpx.post(a.url + CHAT, json=body(), timeout=20).status_code == 200
    proxy.stop()
    r = httpx.post(a.url + CHAT, json=body(), timeout=20)
    # A task budget cannot be checked: refused, in the protocol's shape, saying why.
    assert r.status_code == 503 and r.json()["error"]["code"] == "state_unavailable"
    ready = httpx.get(a.url + "/readyz").json()
    assert ready["status"] == "degraded" and ready["shared_state"] is False
    # Without a budget in play, requests go on with local pins and counts.
    plain, _, _ = pair(local_policy(upstream.url), redis_port=proxy.port)
    assert httpx.post(plain.url + CHAT, json=body(), timeout=20).status_code == 200
    assert httpx.get(plain.url + "/readyz").json()["state_fail_open"]
    metrics = httpx.get(plain.url + "/metrics").text
    assert 'router_state_fail_open_total{component="sessions"}' in metrics
    assert "router_state_degraded 1.0" in metrics
    proxy.start()
    deadline = time.monotonic() + 5
    while httpx.post(a.url + CHAT, json=body(), timeout=20).status_code != 200:
        assert time.monotonic() < deadline, "did not recover after Redis came back"
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while (ready := httpx.get(a.url + "/readyz").json())["status"] != "ok":
        assert time.monotonic() < deadline, ready
        time.sleep(0.3)
    proxy.stop()


def test_postgres_restart_loses_no_acknowledged_record(pair, pg_schema: str) -> None:  # type: ignore[no-untyped-def]
    proxy = TcpProxy(5432).start()
    a, b, _ = pair(pg_port=proxy.port)
    acked = []
    for i in range(5):
        r = httpx.post((a if i % 2 else b).url + CHAT, json=body(), timeout=20)
        acked.append(r.headers["x-request-id"])
    proxy.stop()  # "PostgreSQL restarts": connections cut, new ones refused
    for i in range(20):
        r = httpx.post((a if i % 2 else b).url + CHAT, json=body(), timeout=20)
        assert r.status_code == 200
        acked.append(r.headers["x-request-id"])
    assert httpx.get(a.url + "/readyz").json()["store"] is False
    # Both replicas have failed to write their log (the records wait in their buffers) before
    # PostgreSQL comes back.
    for replica in (a, b):
        writer = replica.server.config.app.state.services.writer
        wait_for(lambda w=writer: w.failures > 0, within=20.0, what="a failed log write")
    proxy.start()
    deadline = time.monotonic() + 20
    while True:
        ids = {r[0] for r in pg_rows(pg_schema, "SELECT request_id FROM requests")}
        if set(acked) <= ids or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert set(acked) <= ids, f"lost {len(set(acked) - ids)} acknowledged records"
    proxy.stop()


TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]
OPENING = [{"role": "user", "content": "The date parser crashes on leap years; fix it."}]


def loop_turn(i: int) -> list[dict[str, Any]]:
    """The assistant's i-th tool call and its result, as an agent sends them back."""
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"file{i}.py"},
    ]


def agent_call(router: Any, task: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(router.url + CHAT, json={"model": "auto", "messages": messages, "tools": TOOLS},
                      headers={"x-router-task-id": task}, timeout=20)  # fmt: skip


def shared_attempt(router: Any, task: str) -> dict[str, str]:
    prefix = router.server.config.app.state.services.settings.redis_prefix
    with redis.Redis(port=REDIS_PORT, decode_responses=True) as r:
        return dict(r.hgetall(Keys(prefix).attempt(task)))


@pytest.mark.parametrize("told", ["the other replica", "the same replica"])
def test_a_failed_attempt_is_restarted_on_the_next_model_whichever_replica_hears_the_outcome(
    pair, told: str
) -> None:  # type: ignore[no-untyped-def]
    a, b, _ = pair()
    task = f"fail-{uuid.uuid4().hex[:8]}"
    first = agent_call(a, task, OPENING)
    assert first.headers["x-router-model"] == "local-nano"
    wait_for(lambda: shared_attempt(a, task).get("calls") == "1", what="the call counted in Redis")
    # The outcome reaches B, which never served the task (or A itself); the restart reaches A.
    hears = b if told == "the other replica" else a
    assert (
        httpx.post(
            hears.url + "/v1/outcomes", json={"task_id": task, "success": False}, timeout=20
        ).status_code
        == 200
    )
    wait_for(lambda: shared_attempt(a, task).get("failed") == "1", what="the failure in Redis")
    again = agent_call(a, task, OPENING)
    # The next attempt: not the model that failed, though the shared pin still names it until it expires.
    assert again.headers["x-router-model"] != "local-nano"


def test_a_call_cap_counts_the_calls_both_replicas_served(pair, upstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    for m in policy["models"]:
        if m["id"] == "local-nano":
            m["max_calls_per_attempt"] = 2
    a, b, _ = pair(policy)
    task = f"cap-{uuid.uuid4().hex[:8]}"
    conversation = list(OPENING)
    for i, replica in enumerate((a, b)):
        r = agent_call(replica, task, conversation)
        assert r.status_code == 200 and r.headers["x-router-model"] == "local-nano", r.text
        wait_for(lambda n=i + 1: shared_attempt(a, task).get("calls") == str(n), what="the call counted")
        conversation += loop_turn(i)
    # A served one call of the attempt and B the other: the third, on A, passes the cap of 2.
    stopped = agent_call(a, task, conversation)
    assert stopped.status_code == 400 and stopped.json()["error"]["code"] == "attempt_stopped", stopped.text
    wait_for(lambda: shared_attempt(a, task).get("rule") == "max_calls_per_attempt", what="the stop in Redis")
    # B refuses the attempt's calls too, and says so on the task.
    assert agent_call(b, task, conversation).status_code == 400
    assert (
        httpx.get(b.url + f"/v1/tasks/{task}", timeout=20).json()["stopped"]["rule"]
        == "max_calls_per_attempt"
    )
    # The restart, on B, is the next attempt, on the next model.
    restarted = agent_call(b, task, OPENING)
    assert restarted.status_code == 200, restarted.text
    assert restarted.headers["x-router-model"] == "local-mini"


def test_a_shared_store_without_redis_is_warned_of_per_process_budgets(
    pg_schema: str,
    router_factory,  # type: ignore[no-untyped-def]
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Replicas that share a PostgreSQL log but no Redis keep budgets and rate limits each in its
    own process: N of them allow a key N times its --budget (each reads the log's spend only at its
    start), and nothing said so (a hostile probe of a careless scale-out). The start warns now."""
    caplog.set_level(logging.WARNING)
    router_factory(local_policy(upstream.url), store=pg_url(pg_schema))
    assert "budgets and rate limits are this process's own" in caplog.text
    assert "--redis" in caplog.text


def test_budgets_restored_while_the_log_is_behind_keep_what_it_had_not_written(
    pg_schema: str,
    router_factory,  # type: ignore[no-untyped-def]
    upstream: FakeUpstream,
) -> None:
    """PostgreSQL away, then Redis back without its data: the first budget check restored the
    task's spend from a log that still lacked the requests answered meanwhile (their records in
    the writer's buffer, their settles lost with Redis), so the budget forgot them: three
    replicas forgot $0.0018 of two keys that way."""
    proxy = TcpProxy(5432).start()
    policy = local_policy(upstream.url)
    policy["objective"] = {"max_cost_per_task": 10.0}
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    a = router_factory(policy, store=pg_url(pg_schema, proxy.port), redis_prefix=prefix,
                       redis_url=f"redis://127.0.0.1:{REDIS_PORT}/0", redis_timeout_s=5.0)  # fmt: skip
    task = f"behind-{uuid.uuid4().hex[:8]}"
    writer = a.server.config.app.state.services.writer

    def call() -> None:
        r = httpx.post(a.url + CHAT, json=body("word " * 300), headers={"x-router-task-id": task}, timeout=20)
        assert r.status_code == 200, r.text

    call()
    wait_for(lambda: writer.written >= 1, what="the first record in the log")
    proxy.stop()
    for _ in range(3):
        call()  # settled in Redis; their records wait in the writer's buffer
    # Retrying with a back-off of about a second and growing: the restore below comes first.
    wait_for(lambda: writer.failures_in_row >= 1, within=20, what="failed log writes")
    with redis.Redis(port=REDIS_PORT) as shared:
        shared.delete(*shared.scan_iter(match=prefix + "*", count=1000))  # Redis back empty
    proxy.start()
    try:
        call()  # its budget check restores the task's spend from the log
        wait_for(lambda: writer.buffered == 0, within=20, what="the buffer written")
        sql = f"SELECT SUM(cost_usd), COUNT(*) FROM requests WHERE task_id = '{task}'"
        (logged,) = pg_rows(pg_schema, sql)
        assert logged[1] == 5
        with redis.Redis(port=REDIS_PORT) as shared:
            counted = int(shared.hget(Keys(prefix).budget(f"task:{task}")[0], "spent") or 0) / 1e9
        assert counted == pytest.approx(logged[0], abs=1e-9), f"the budget counts ${counted} of ${logged[0]}"
    finally:
        proxy.stop()
