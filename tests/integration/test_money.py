"""Money through a real router (issue 30): what a key or a task spends is counted, whatever
Redis does meanwhile, and a budget refuses only what does not fit.

Redis is the machine's real server behind a ``TcpProxy`` (cut and restored without touching the
shared server); each test has its own key prefix, so "Redis came back empty" is played by
deleting that prefix's keys.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest
import redis

from router.fakeupstream import FakeUpstream
from router.forward.timeouts import Timeouts
from router.shared import Spend, StateConfig, open_state
from router.shared.redis_keys import Keys
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.tcpproxy import TcpProxy
from tests.integration.test_faults import HI, faulty
from tests.integration.test_keys import MASTER, create_key

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]
REDIS_PORT = int(os.environ.get("ROUTER_TEST_REDIS_PORT", "6379"))
CHAT = "/v1/chat/completions"
SLOW = Timeouts(connect=1.0, first_token=10.0, idle=10.0, overall=60.0)


def redis_router(
    router_factory: Factory, policy: dict[str, Any], port: int = REDIS_PORT, **kw: Any
) -> tuple[RunningRouter, str]:
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    r = router_factory(policy, redis_url=f"redis://127.0.0.1:{port}/0", redis_prefix=prefix,
                       redis_timeout_s=2.0, timeouts=SLOW, **kw)  # fmt: skip
    return r, prefix


def redis_spent(prefix: str, scope: str) -> float:
    """What Redis counts as spent in ``scope`` (settled, not held)."""
    with redis.Redis(port=REDIS_PORT) as r:
        nano = r.hget(Keys(prefix).budget(scope)[0], "spent")
    return int(nano or 0) / 1e9


def held(prefix: str, scope: str) -> int:
    """How many reservations hold money in ``scope``."""
    with redis.Redis(port=REDIS_PORT) as r:
        return int(r.hlen(Keys(prefix).budget(scope)[2]))


def logged_spend(r: RunningRouter, task_id: str, n: int) -> float:
    rows = [row for row in r.records(n, timeout=10) if row["task_id"] == task_id]
    return sum(row["cost_usd"] or 0.0 for row in rows)


def flush_prefix(prefix: str) -> None:
    """Redis restarted without its data, as far as this router's keys go."""
    with redis.Redis(port=REDIS_PORT) as r:
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)


def chat(r: RunningRouter, model: str, task: str, **headers: str) -> httpx.Response:
    return httpx.post(r.url + CHAT, json={"model": model, "messages": HI},
                      headers={"x-router-task-id": task, **headers}, timeout=30)  # fmt: skip


def test_settles_cut_off_by_a_redis_outage_land_when_it_returns(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """Issue 30 #2: requests in flight when Redis goes away settle once it is back, each once."""
    proxy = TcpProxy(REDIS_PORT).start()
    policy = faulty(upstream, "ttft_ms=4000")
    policy["objective"] = {"max_cost_per_task": 10.0}
    r, prefix = redis_router(router_factory, policy, port=proxy.port)
    task = f"settle-{uuid.uuid4().hex[:8]}"
    assert chat(r, "solo", task).status_code == 200  # one settled normally, before the cut
    with ThreadPoolExecutor(6) as pool:
        flying = [pool.submit(chat, r, "solo", task) for _ in range(6)]
        deadline = time.monotonic() + 3.5
        while held(prefix, f"task:{task}") < 6 and time.monotonic() < deadline:
            time.sleep(0.05)  # until all six hold their estimate and wait for the slow backend
        proxy.stop()  # Redis "restarts": the six finish and settle while it is away
        statuses = [f.result().status_code for f in flying]
    assert statuses.count(200) >= 3, statuses
    time.sleep(1.0)
    proxy.start()
    logged = logged_spend(r, task, 1 + len(statuses))
    assert logged > 0
    deadline = time.monotonic() + 15
    while abs(redis_spent(prefix, f"task:{task}") - logged) > 1e-9 and time.monotonic() < deadline:
        time.sleep(0.2)
    # Every settle landed once: the spend Redis counts is the spend the log has, no less, no more.
    assert redis_spent(prefix, f"task:{task}") == pytest.approx(logged, abs=1e-9)
    proxy.stop()


def test_a_budget_outlives_redis_coming_back_empty(router_factory: Factory, upstream: FakeUpstream) -> None:
    """Issue 30 #3: an exhausted budget stays exhausted when Redis restarts without its data."""
    policy = faulty(upstream, "")
    est, cost = _estimate(redis_router(router_factory, policy)[0])
    # Room for the estimate and about three calls' actual cost: the fourth or so is refused.
    policy["objective"] = {"max_cost_per_task": est + 3 * cost}
    r, prefix = redis_router(router_factory, policy, durable_log=True)
    task = f"flush-{uuid.uuid4().hex[:8]}"
    statuses: list[int] = []
    while 403 not in statuses:
        statuses.append(chat(r, "solo", task).status_code)
        assert len(statuses) < 20, statuses
    spent = redis_spent(prefix, f"task:{task}")
    assert spent > 0
    flush_prefix(prefix)
    assert chat(r, "solo", task).status_code == 403, "the budget started again from zero"
    # Restored from the log, and no more than it was.
    assert redis_spent(prefix, f"task:{task}") == pytest.approx(spent, abs=1e-9)
    other = f"fresh-{uuid.uuid4().hex[:8]}"
    assert chat(r, "solo", other).status_code == 200, "a task with nothing spent is refused"


def _estimate(r: RunningRouter) -> tuple[float, float]:
    """The estimate and the actual cost of one call of the test's request."""
    assert chat(r, "solo", "estimate").status_code == 200
    row = r.records(1)[-1]
    assert row["cost_est_usd"] > row["cost_usd"] > 0
    return row["cost_est_usd"], row["cost_usd"]


async def test_a_settle_retried_after_its_reply_was_lost_counts_once() -> None:
    """The retry of a settle whose first try landed unanswered (#2) must not count it twice."""
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    state = open_state(f"redis://127.0.0.1:{REDIS_PORT}/0", StateConfig(prefix=prefix, op_timeout_s=3.0))
    try:
        held = await state.budgets.reserve(["key:k"], 0.5, {"key:k": 1.0})
        await state.budgets.settle(held, 0.25)
        held.closed = False  # as a retry sees it: it never heard that the first try landed
        await state.budgets.settle(held, 0.25)
        assert await state.budgets.spent("key:k") == Spend(0.25, 0.0)
    finally:
        await state.aclose()
        flush_prefix(prefix)


# --- scopes narrow what a key allows (#4) --------------------------------------------------------


def cheap_auto(upstream: FakeUpstream, scopes: list[dict[str, Any]]) -> dict[str, Any]:
    """The demo policy with ``auto`` routed to the two cheap backends only, and these scopes."""
    policy = local_policy(upstream.url)
    policy["routes"][0]["candidates"] = ["local-nano", "local-mini"]
    policy["scopes"] = scopes
    return policy


@pytest.mark.parametrize(
    "steer",
    [{"x-router-repo": "acme/api"}, {"x-router-team": "platform"}, {"first_user": "see https://github.com/acme/api/pull/1"}],
    ids=["repo-header", "team-header", "git-url-in-prompt"],
)  # fmt: skip
def test_a_scope_the_client_picks_cannot_widen_what_its_key_allows(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], steer: dict[str, str]
) -> None:
    """Issue 30 #4: a key restricted to ``auto`` reached a model 25x dearer through a scope it chose."""
    dear = {"routes": [{"match": "auto", "candidates": ["local-claude", "local-mini"]}],
            "rules": [{"name": "go-dear", "when": {"stream": False}, "prefer": ["local-claude"]}]}  # fmt: skip
    policy = cheap_auto(upstream, [{"name": "acme", "match": {"repo": "acme/*"}, **dear},
                                   {"name": "platform", "match": {"team": "platform"}, **dear}])  # fmt: skip
    r = router_factory(policy, master_key=MASTER)
    key = create_key(r, capsys, "--name", "auto-only", "--models", "auto")
    text = steer.pop("first_user", "hi")
    for i in range(6):
        resp = httpx.post(r.url + CHAT, json={"model": "auto", "messages": [{"role": "user", "content": text}]},
                          headers={"x-api-key": key["key"], "x-router-task-id": f"w{i}", **steer}, timeout=30)  # fmt: skip
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-router-model"] in {"local-nano", "local-mini"}


def test_team_scopes_come_from_the_key_not_a_header(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30 #4: the team a scope matches was the client's ``X-Router-Team`` header, so any key
    could take any team's scope. Now a virtual key's team is the one it was created with; only the
    operator's master key (or open mode) may still name one by header."""
    mini = {"rules": [{"name": "go-mini", "when": {"stream": False}, "prefer": ["local-mini"]}]}
    r = router_factory(cheap_auto(upstream, [{"name": "platform", "match": {"team": "platform"}, **mini}]),
                       master_key=MASTER)  # fmt: skip
    member = create_key(r, capsys, "--name", "member", "--team", "platform")
    outsider = create_key(r, capsys, "--name", "outsider")
    sent = [(member["key"], {}), (outsider["key"], {"x-router-team": "platform"}),
            (member["key"], {"x-router-team": "other"}), (MASTER, {"x-router-team": "platform"})]  # fmt: skip
    for i, (key, headers) in enumerate(sent):
        resp = httpx.post(r.url + CHAT, json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                          headers={"x-api-key": key, "x-router-task-id": f"team{i}", **headers}, timeout=30)  # fmt: skip
        assert resp.status_code == 200, resp.text
    rows = {
        row["task_id"].rsplit("team", 1)[-1]: row for row in r.records(len(sent)) if "team" in row["task_id"]
    }
    scoped = {i: "/platform/" in rows[str(i)]["policy"] for i in range(len(sent))}
    assert scoped == {0: True, 1: False, 2: True, 3: True}
    # The log keeps the team that decided, so a preview of the log matches the same scope.
    assert orjson.loads(rows["1"]["rule_headers"]).get("x-router-team") is None
    assert orjson.loads(rows["2"]["rule_headers"])["x-router-team"] == "platform"


def test_a_scope_budget_per_task_is_enforced(router_factory: Factory, upstream: FakeUpstream) -> None:
    """Issue 30 #4: a scope's ``max_cost_per_task`` was never enforced (2.4x over)."""
    policy = faulty(upstream, "")
    est, cost = _estimate(router_factory(policy))
    policy["scopes"] = [{"name": "acme", "match": {"repo": "acme/*"},
                         "objective": {"max_cost_per_task": est + 2 * cost}}]  # fmt: skip
    r = router_factory(policy)
    statuses: list[int] = []
    while 403 not in statuses:
        statuses.append(chat(r, "solo", "scoped", **{"x-router-repo": "acme/api"}).status_code)
        assert len(statuses) < 20, "the scope's budget was never enforced"
    spent = sum(row["cost_usd"] or 0 for row in r.records(len(statuses)) if row["task_id"] == "scoped")
    assert spent <= est + 2 * cost + 1e-12


# --- the key's budget steers the decision (#5) ---------------------------------------------------


def test_a_key_budget_refuses_only_when_no_candidate_fits(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30 #5: ``403 budget_exceeded`` with 6.5% of a key's budget spent, each time exploration
    picked a dear model while a cheaper one fitted. The key's remaining budget now excludes the
    candidates that would not fit before ranking and exploration."""
    policy = local_policy(upstream.url)
    policy["routes"][0]["candidates"] = ["local-nano", "local-claude"]
    policy["objective"]["exploration"] = {"epsilon": 1.0, "seed": 7}  # a random candidate every time
    r = router_factory(policy, master_key=MASTER)
    body = {"model": "auto", "messages": HI}
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    hold = {c["model"]: c.get("hold_usd", c["cost_usd"]) for c in seen["candidates"]}
    assert hold["local-claude"] > 20 * hold["local-nano"]
    # The dear model never fits this budget, the cheap one fits twenty times over.
    roomy = create_key(r, capsys, "--name", "roomy", "--budget", str(20 * hold["local-nano"] + 1e-9))
    served = []
    for i in range(12):
        resp = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": roomy["key"], "x-router-task-id": f"k{i}"},
                          timeout=30)  # fmt: skip
        assert resp.status_code == 200, (i, resp.text)
        served.append(resp.headers["x-router-model"])
    assert set(served) == {"local-nano"}
    # Refused when no candidate fits, saying so.
    tight = create_key(r, capsys, "--name", "tight", "--budget", str(hold["local-nano"] / 2))
    resp = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": tight["key"]}, timeout=30)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "budget_exceeded", resp.text


def forty_at_once(
    r: RunningRouter, key: dict[str, Any], body: dict[str, Any], path: str = CHAT
) -> tuple[list[int], float]:
    """40 requests at once on ``key``, a task each: their statuses, and what the log charged the key."""

    def post(i: int) -> int:
        headers = {"x-api-key": key["key"], "x-router-task-id": f"fb{i}"}
        return httpx.post(r.url + path, json=body, headers=headers, timeout=30).status_code

    with ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(post, range(40)))
    rows = [row for row in r.records(42, timeout=10) if row["key_id"] == key["key_id"]]
    return statuses, sum(row["cost_usd"] or 0.0 for row in rows)


def test_requests_in_flight_that_fall_back_cannot_spend_past_a_key_budget(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """Admission held the chosen backend's estimate alone. When it failed, its requests in flight
    all fell back to a dearer backend: 40 at once on a key with $0.05 spent $0.1146 (found by
    probing a router whose cheap backend was down). The hold is now the dearest of the backends
    the request may be served by."""
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@status=500"  # local-nano is down
    policy["routes"][0]["candidates"] = ["local-nano", "local-claude"]
    policy["rules"] = []
    r = router_factory(policy, master_key=MASTER)
    body = {"model": "auto", "messages": [{"role": "user", "content": "fix it " * 300}]}
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    assert seen["order"] == ["local-nano", "local-claude"]
    hold = {c["model"]: c.get("hold_usd", c["cost_usd"]) for c in seen["candidates"]}
    served = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": MASTER}, timeout=30)
    assert served.headers["x-router-model"] == "local-claude"
    cost = float(served.headers["x-router-cost-usd"])
    budget = 1.5 * hold["local-claude"]  # room for one request on the dear backend
    assert 40 * cost > 2 * budget  # without the hold, the 40 would spend past it
    key = create_key(r, capsys, "--name", "falls-back", "--budget", str(budget))

    statuses, spent = forty_at_once(r, key, body)
    assert 200 in statuses
    assert spent <= budget, (spent, budget, statuses)


def test_a_route_fallback_is_held_and_left_out_when_the_budget_cannot_hold_it(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A route's fallbacks (not candidates) had no estimate, so no hold: with the one candidate
    down, 40 requests at once on a key each held the cheap backend's estimate and were all served
    by the dear fallback, past the key's budget. A fallback is now estimated and held like a
    candidate, and left out where the budget left cannot hold it."""
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@status=500"  # local-nano is down
    policy["routes"][0]["candidates"] = ["local-nano"]
    policy["routes"][0]["fallbacks"] = ["local-claude"]
    policy["rules"] = []
    r = router_factory(policy, master_key=MASTER)
    body = {"model": "auto", "messages": [{"role": "user", "content": "fix it " * 300}]}
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    assert seen["order"] == ["local-nano", "local-claude"]
    fallback = {e["model"]: e for e in seen["fallbacks"]}["local-claude"]
    hold = fallback.get("hold_usd", fallback["cost_usd"])
    served = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": MASTER}, timeout=30)
    assert served.headers["x-router-model"] == "local-claude"
    cost = float(served.headers["x-router-cost-usd"])
    budget = 1.5 * hold  # room for one request on the fallback
    assert 40 * cost > 2 * budget  # without its hold, the 40 would spend past it
    key = create_key(r, capsys, "--name", "falls-back", "--budget", str(budget))

    statuses, spent = forty_at_once(r, key, body)
    assert 200 in statuses
    assert spent <= budget, (spent, budget, statuses)
    # A key with room for the candidate but not for the fallback is not served by the fallback.
    nano = {e["model"]: e for e in seen["candidates"]}["local-nano"]
    between = (nano.get("hold_usd", nano["cost_usd"]) + hold) / 2
    small = create_key(r, capsys, "--name", "small", "--budget", str(between))
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": small["key"]}, timeout=30).json()
    assert seen["order"] == ["local-nano"], seen
    refused = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": small["key"]}, timeout=30)
    assert refused.status_code >= 500 and "x-router-cost-usd" not in refused.headers  # local-nano is down


REASONING = {"model": "solo", "messages": HI, "reasoning_effort": "high"}


def test_a_reasoning_stream_cut_before_its_usage_is_charged_for_its_thinking(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reasoning model's thinking is billed but not streamed: a stream cut after its first
    tokens (the backend dropped it; a client leaving is the same) was charged for the 2 tokens it
    showed, not the 512 of thinking the provider reported for the same call in full, and the
    key's budget counted only those."""
    whole = router_factory(faulty(upstream, ""), master_key=MASTER)
    assert (
        httpx.post(whole.url + CHAT, json=REASONING, headers={"x-api-key": MASTER}, timeout=30).status_code
        == 200
    )
    full = whole.records(1)[-1]
    assert full["reasoning_tokens"] == 512 and full["usage_estimated"] == 0

    r = router_factory(faulty(upstream, "break_after=2"), master_key=MASTER)
    est = httpx.post(r.url + "/v1/route", json=REASONING, headers={"x-api-key": MASTER}, timeout=30).json()
    hold = est["candidates"][0].get("hold_usd", est["candidates"][0]["cost_usd"])
    key = create_key(r, capsys, "--name", "cut", "--budget", str(1.5 * hold))  # room for one call
    headers = {"x-api-key": key["key"], "x-router-task-id": "cut-1"}
    with httpx.stream(
        "POST", r.url + CHAT, json={**REASONING, "stream": True}, headers=headers, timeout=30
    ) as resp:
        assert b"broke off the stream" in b"".join(resp.iter_bytes())
    row = r.records(2)[-1]
    assert row["error_type"] == "UpstreamError" and row["usage_estimated"] == 1
    assert row["output_tokens"] >= full["output_tokens"], row  # its thinking, not the 2 tokens shown
    assert row["cost_usd"] >= full["cost_usd"]
    # The key's budget counted it: what is left cannot hold another call.
    again = httpx.post(
        r.url + CHAT, json=REASONING, headers={**headers, "x-router-task-id": "cut-2"}, timeout=30
    )
    assert again.status_code == 403, again.text


def test_a_try_given_up_while_its_backend_reasons_is_charged(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """A try the router gave up on at the first-token timeout while the backend reasoned was
    charged nothing, though the provider bills the prompt and the thinking it had done: now its
    estimate is charged, named in the try's log entry, whether another backend then served the
    request or none did (the one backend of ``solo``, waited for to the overall deadline)."""
    quick = Timeouts(connect=1.0, first_token=1.0, idle=10.0, overall=5.0)
    r = router_factory(faulty(upstream, "ttft_ms=8000"), timeouts=quick)
    body = {**REASONING, "model": "auto", "stream": True}
    est = httpx.post(r.url + "/v1/route", json=body, timeout=30).json()
    faulty_cost = next(c["cost_usd"] for c in est["candidates"] if c["model"] == "faulty")
    assert httpx.post(r.url + CHAT, json=body, timeout=30).status_code == 200
    # A task of its own: the first one's prompt, cached, would make this one's estimate cheaper.
    solo, task = {**body, "model": "solo"}, {"x-router-task-id": "alone"}
    alone = httpx.post(r.url + "/v1/route", json=solo, headers=task, timeout=30).json()
    assert httpx.post(r.url + CHAT, json=solo, headers=task, timeout=30).status_code == 504
    fell_back, failed = r.records(2, timeout=10)[-2:]
    gave_up, served = orjson.loads(fell_back["tries"])
    assert gave_up["model"] == "faulty" and gave_up["cost_usd"] == pytest.approx(faulty_cost)
    assert served["model"] == "good" and "cost_usd" not in served
    assert fell_back["cost_usd"] > faulty_cost and fell_back["usage_estimated"] == 1
    assert failed["status"] == 504 and failed["usage_estimated"] == 1
    assert failed["cost_usd"] == pytest.approx(sum(t["cost_usd"] for t in orjson.loads(failed["tries"])))
    (waited,) = orjson.loads(failed["tries"])
    assert waited["error_type"] == "UpstreamTimeout" and failed["error_type"] == "UpstreamTimeout"
    assert waited["cost_usd"] == pytest.approx(alone["candidates"][0]["cost_usd"])


def test_a_lone_backend_late_to_its_first_token_is_waited_for_and_paid_once(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """With one backend for the request (a route of one, or the only one a budget fits), a stream
    late to its first token was given up at the first-token timeout and the same backend tried
    again from the start: two tries billed ($0.001208 each in the budget probe), then a 504, where
    waiting for the first would have served it, sooner. Now the last backend standing is waited
    for to the overall deadline: one try, served, nothing given up."""
    quick = Timeouts(connect=1.0, first_token=1.0, idle=10.0, overall=30.0)
    r = router_factory(faulty(upstream, "ttft_ms=2500"), timeouts=quick)
    body = {**REASONING, "stream": True}
    resp = httpx.post(r.url + CHAT, json=body, timeout=30)
    (row,) = r.records(1, timeout=10)
    tries = orjson.loads(row["tries"])
    assert [(t["model"], t["status"]) for t in tries] == [("faulty", 200)], (resp.status_code, tries)
    assert resp.status_code == 200 and "cost_usd" not in tries[0]  # no try given up and billed


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_stream_cut_before_its_usage_is_charged_for_the_text_it_sent(
    router_factory: Factory, upstream: FakeUpstream, protocol: str
) -> None:
    """A stream cut before the provider's usage was charged a token per content event: 6 events
    of about 800 tokens each (as some backends and translations send them) cost 6 tokens, so a
    client leaving before the end had the text nearly free. Now what the events carried is
    tokenized."""
    path, body = (CHAT, {"model": "solo", "messages": HI}) if protocol == "openai" else (
        "/v1/messages", {"model": "solo", "max_tokens": 20000, "messages": HI})  # fmt: skip
    charged = []
    for behaviour in ("big_kb=40,chunks=8", "big_kb=40,chunks=8,break_after=6"):
        r = router_factory(faulty(upstream, behaviour, protocol))
        with httpx.stream("POST", r.url + path, json={**body, "stream": True}, timeout=30) as resp:
            b"".join(resp.iter_bytes())
        charged.append(r.records(1)[-1])
    whole, cut = charged
    assert (
        whole["usage_estimated"] == 0 and cut["usage_estimated"] == 1 and cut["error_type"] == "UpstreamError"
    )
    # 6 of its 8 equal events: about three quarters of the whole reply's output.
    assert 0.6 * whole["output_tokens"] <= cut["output_tokens"] <= whole["output_tokens"], (whole, cut)


HOSTED = {
    "openai_responses": ("/v1/responses", {"model": "solo", "input": "hi", "tools": [{"type": "web_search"}]}),
    "anthropic": ("/v1/messages", {"model": "solo", "max_tokens": 1000, "messages": HI,
                                   "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
}  # fmt: skip


@pytest.mark.parametrize("protocol", list(HOSTED))
def test_hosted_tool_calls_are_charged_and_held(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    """A web search the provider runs while it answers is billed $0.01 a call on top of tokens
    (OpenAI and Anthropic alike): the router charged nothing for it and held nothing, so a reply
    that searched 3 times was logged at its tokens alone (~$0.00002 of ~$0.03), and 40 requests
    at once on a key with $0.05 all ran. Now each call is charged, streamed or not, and a request
    that declares the tool holds one call."""
    path, body = HOSTED[protocol]
    policy = faulty(upstream, "hosted_calls=3", protocol)
    policy["defaults"] = {"held_tool_calls": 3}  # what this backend's replies do
    r = router_factory(policy, master_key=MASTER)
    for stream in (False, True):
        with httpx.stream("POST", r.url + path, json={**body, "stream": stream}, timeout=30,
                          headers={"x-api-key": MASTER}) as resp:  # fmt: skip
            assert resp.status_code == 200
            b"".join(resp.iter_bytes())
    for row in r.records(2)[-2:]:
        assert row["cost_tools_usd"] == pytest.approx(0.03), row
        parts = ("input", "output", "cache_read", "cache_write", "tools")
        assert row["cost_usd"] == pytest.approx(sum(row[f"cost_{p}_usd"] for p in parts))
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    assert seen["candidates"][0]["hold_usd"] >= 0.03
    budget = 0.05  # room for one such reply, not for 40
    key = create_key(r, capsys, "--name", "searches", "--budget", str(budget))
    statuses, spent = forty_at_once(r, key, {**body, "stream": False}, path)
    assert 200 in statuses
    assert spent <= budget, (spent, statuses)


@pytest.mark.parametrize("protocol", list(HOSTED))
def test_hosted_tools_without_a_cap_cannot_spend_past_a_key_budget(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    """A request holds one call of each hosted tool it declares (``defaults.held_tool_calls``),
    and the provider may make more when the request sets no ``max_uses``. The key's worst-case
    hold counted the tokens alone: a request searching four times ($0.04) held ~$0.01, and a
    second was admitted beside it on a key with $0.05, both spending $0.08. The worst case now
    counts the policy's most calls of an uncapped tool (``defaults.worst_tool_calls``, 10)."""
    path, body = HOSTED[protocol]
    r = router_factory(faulty(upstream, "hosted_calls=4,ttft_ms=1500", protocol), master_key=MASTER,
                       timeouts=SLOW)  # fmt: skip
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    assert 0.01 <= seen["candidates"][0]["hold_usd"] < 0.02  # one search held
    budget = 0.05
    key = create_key(r, capsys, "--name", "searches", "--budget", str(budget))

    def ask(task: str) -> httpx.Response:
        return httpx.post(r.url + path, json=body, headers={"x-api-key": key["key"], "x-router-task-id": task},
                          timeout=30)  # fmt: skip

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(ask, "first")
        time.sleep(0.75)  # admitted: it holds while its backend thinks
        second = ask("second")
        assert first.result().status_code == 200
    assert second.status_code == 429, "a second request was admitted beside one that may search ten times"
    assert "held by requests in flight" in second.json()["error"]["message"]
    rows = [row for row in r.records(3, timeout=10) if row["key_id"] == key["key_id"]]
    assert sum(row["cost_usd"] or 0.0 for row in rows) <= budget


def test_a_responses_max_tool_calls_reaches_the_provider_and_caps_what_is_held(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """A Responses request may cap its hosted calls, all kinds together (``max_tool_calls``). The
    router dropped the field: the provider searched three times where one was allowed, $0.03
    billed for $0.01, and the key's worst case counted ten searches (``worst_tool_calls``)."""
    path, body = HOSTED["openai_responses"]
    r = router_factory(faulty(upstream, "hosted_calls=3", "openai_responses"))
    capped = {**body, "max_tool_calls": 1}
    resp = httpx.post(r.url + path, json=capped, timeout=30)
    assert resp.status_code == 200, resp.text
    assert r.records(1)[-1]["cost_tools_usd"] == pytest.approx(0.01)  # the provider stopped at one
    free, one = (
        httpx.post(r.url + "/v1/route", json=b, timeout=30).json()["candidates"][0] for b in (body, capped)
    )
    assert free["worst_usd"] - one["worst_usd"] == pytest.approx(9 * 0.01)


def test_a_responses_failure_is_charged_the_usage_it_reports(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """OpenAI ends a response that failed once begun with ``response.failed``, carrying the usage
    it bills (here 520 output tokens, 512 of them reasoning). Before the first token the router
    moved on to another backend and charged the failed try nothing; after it, the stream was
    logged as a success and charged an estimate. Now the reported usage is charged in both
    cases, and the stream that failed is logged as failed."""
    body = {"input": "hi", "reasoning": {"effort": "high"}, "stream": True}
    early = router_factory(faulty(upstream, "error_after=0,failed_event=1", "openai_responses"))
    late = router_factory(faulty(upstream, "error_after=2,failed_event=1", "openai_responses"))
    for r, model in ((early, "auto"), (late, "solo")):
        with httpx.stream("POST", r.url + "/v1/responses", json={**body, "model": model}, timeout=30) as resp:
            assert resp.status_code == 200
            b"".join(resp.iter_bytes())
    fell_back = early.records(1)[-1]
    failed, served = orjson.loads(fell_back["tries"])
    assert failed["model"] == "faulty" and served["model"] == "good"
    assert failed["cost_usd"] >= 520 * 2e-6  # its output at faulty's $2 per million
    assert fell_back["cost_usd"] > failed["cost_usd"] + 520 * 4e-6  # and good's reply, at $4
    cut = late.records(1)[-1]
    assert cut["error_type"] == "UpstreamError" and cut["usage_estimated"] == 0, cut
    assert cut["output_tokens"] == 520 and cut["reasoning_tokens"] == 512


def test_a_try_given_up_on_a_model_that_does_not_reason_is_charged(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """A whole reply the router gave up on at the idle timeout was being written by its backend,
    which bills it, and a stream given up before its first token had its prompt read; neither was
    charged when the request did not ask for reasoning, so a key whose backend stalled spent
    nothing on the calls it was billed for. Now the first is charged at its estimate, the second
    its prompt."""
    stalls = Timeouts(connect=1.0, first_token=1.0, idle=1.0, overall=30.0)
    r = router_factory(faulty(upstream, "ttft_ms=3000"), timeouts=stalls)
    body = {"model": "auto", "messages": HI}
    est = httpx.post(r.url + "/v1/route", json=body, timeout=30).json()
    faulty_est = next(c for c in est["candidates"] if c["model"] == "faulty")
    for stream in (False, True):  # a task each: a task that failed on faulty is not sent there again
        headers = {"x-router-task-id": f"stalled-{stream}"}
        assert (
            httpx.post(r.url + CHAT, json={**body, "stream": stream}, headers=headers, timeout=30).status_code
            == 200
        )
    whole, streamed = r.records(2, timeout=10)[-2:]
    for row, charged in ((whole, faulty_est["cost_usd"]), (streamed, faulty_est["prompt_tokens"] * 1e-6)):
        gave_up, served = orjson.loads(row["tries"])
        assert gave_up["model"] == "faulty" and gave_up["error_type"] == "UpstreamTimeout", row
        assert served["model"] == "good" and "cost_usd" not in served
        assert gave_up["cost_usd"] == pytest.approx(charged), row
        assert row["cost_usd"] > charged and row["usage_estimated"] == 1


def test_a_cut_stream_of_a_model_that_reasons_unasked_is_charged_for_its_thinking(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """OpenAI's reasoning models think by default, billed and unseen: a stream cut after its
    first tokens with no reasoning_effort in the request was charged the 2 tokens it showed.
    A catalog model that can think (outside Anthropic, whose models think only when asked) is
    now charged for its expected output on a cut, as a request that asks to reason is."""
    policy = faulty(upstream, "break_after=2")
    policy["models"][0]["capabilities"] = {"thinking": True}
    r = router_factory(policy)
    body = {"model": "solo", "messages": HI, "stream": True}
    est = httpx.post(r.url + "/v1/route", json=body, timeout=30).json()["candidates"][0]
    with httpx.stream("POST", r.url + CHAT, json=body, timeout=30) as resp:
        b"".join(resp.iter_bytes())
    row = r.records(1)[-1]
    assert row["error_type"] == "UpstreamError" and row["usage_estimated"] == 1
    assert row["output_tokens"] >= est["output_tokens"], (row, est)


def _timing_out(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], name: str,
    **shared: Any,
) -> tuple[RunningRouter, dict[str, Any], dict[str, Any], float]:  # fmt: skip
    """A router whose first backend is given up at the first-token timeout (billed its estimate)
    before the dearer one serves, and a key with room for two and a half holds: the router, the
    key, the request's body and the key's budget."""
    # Two seconds to the first token: forty requests at once on a loaded two-core machine took
    # the good backend's first token past one second, and nothing was served to spend.
    quick = Timeouts(connect=1.0, first_token=2.0, idle=10.0, overall=30.0)
    r = router_factory(faulty(upstream, "ttft_ms=6000"), timeouts=quick, master_key=MASTER, **shared)
    body = {"model": "auto", "messages": HI, "reasoning_effort": "high", "max_tokens": 600, "stream": True}
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    assert seen["order"] == ["faulty", "good"]
    budget = 2.5 * max(c.get("hold_usd", c["cost_usd"]) for c in seen["candidates"])
    return r, create_key(r, capsys, "--name", name, "--budget", str(budget)), body, budget


def test_requests_whose_tries_time_out_cannot_spend_past_a_key_budget(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A try given up at the first-token timeout while its backend reasons is charged its
    estimate, and the next backend then serves: two calls paid, one held. With the client's
    max_tokens capping the output, the hold is the dearest backend's cost at that cap, so 40
    requests at once on a key with room for about two and a half holds spent past it. One
    request served alone first leaves the forty room for one fallback at most."""
    r, key, body, budget = _timing_out(router_factory, upstream, capsys, "times-out")
    alone = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": key["key"]}, timeout=30)
    assert alone.status_code == 200, alone.text
    (row,) = r.records(1)
    assert [t["model"] for t in orjson.loads(row["tries"])] == ["faulty", "good"], row
    statuses, spent = forty_at_once(r, key, body)
    assert spent <= budget + 1e-9, (spent, budget, statuses)  # the budgets count nano-dollars


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_requests_whose_tries_time_out_at_a_key_budgets_end_are_served(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], store: str
) -> None:
    """Forty requests at once on a key with room for two and a half holds, each first try given
    up at the first-token timeout (and billed) before the next backend serves: the first admitted
    held the key whole between them, each was then refused the money its given-up try cost (held
    by the others) and none of forty was served, though each admitted one paid a try. A request
    now holds, of what its key has left, a given-up try besides its serving one, the first
    admitted as one hold: it pays the try out of that, and the later ones are refused before
    they pay anything."""
    shared: dict[str, Any] = {}
    if store == "redis":
        shared = {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "redis_timeout_s": 2.0,
                  "redis_prefix": f"test:{uuid.uuid4().hex[:8]}:"}  # fmt: skip
    r, key, body, budget = _timing_out(router_factory, upstream, capsys, "at-the-end", **shared)
    statuses, spent = forty_at_once(r, key, body)
    assert 200 in statuses, statuses
    assert spent <= budget + 1e-9, (spent, budget, statuses)  # the budgets count nano-dollars


def test_the_client_is_told_the_cost_of_the_tries_given_up_streamed_or_not(
    router_factory: Factory, upstream: FakeUpstream
) -> None:
    """A reply served after a try given up at a timeout cost the operator both, and the log counts
    both; a whole reply's ``x-router-cost-usd`` said so, but a stream's ``usage.cost`` was the
    serving backend's call alone. Both now tell the client what the log counts."""
    stalls = Timeouts(connect=1.0, first_token=1.0, idle=1.0, overall=30.0)
    r = router_factory(faulty(upstream, "ttft_ms=3000"), timeouts=stalls)
    body = {"model": "auto", "messages": HI}
    whole = httpx.post(r.url + CHAT, json=body, headers={"x-router-task-id": "told-whole"}, timeout=30)
    assert whole.status_code == 200
    told = {"whole": float(whole.headers["x-router-cost-usd"])}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", r.url + CHAT, json=streamed, headers={"x-router-task-id": "told-stream"},
                      timeout=30) as resp:  # fmt: skip
        assert "x-router-cost-usd" not in resp.headers  # sent before the reply's cost is known
        frames = [line[6:] for line in resp.iter_lines() if line.startswith("data: {")]
    usage = [orjson.loads(f)["usage"] for f in frames if orjson.loads(f).get("usage")]
    told["stream"] = usage[-1]["cost"]
    rows = {row["task_id"].removeprefix("told-"): row for row in r.records(2, timeout=10)[-2:]}
    for kind, row in rows.items():
        gave_up, served = orjson.loads(row["tries"])
        assert gave_up["model"] == "faulty" and gave_up["cost_usd"] > 0 and served["model"] == "good", row
        assert told[kind] == pytest.approx(row["cost_usd"], abs=1e-9), (kind, told[kind], row["cost_usd"])


def test_a_server_tools_max_uses_caps_what_its_request_holds(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Anthropic server tool's ``max_uses`` is the most calls the provider makes of it for one
    reply; the router held ``defaults.held_tool_calls`` of each declared tool whatever it said,
    so a request allowing one search held three ($0.03), and a key with room for that one search
    was refused. Now a request holds the fewer of the two."""
    path, body = HOSTED["anthropic"]
    body = {**body, "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]}
    policy = faulty(upstream, "hosted_calls=3", "anthropic")
    policy["defaults"] = {"held_tool_calls": 3}
    r = router_factory(policy, master_key=MASTER)
    seen = httpx.post(r.url + "/v1/route", json=body, headers={"x-api-key": MASTER}, timeout=30).json()
    hold = seen["candidates"][0]["hold_usd"]
    assert 0.01 <= hold < 0.02, seen["candidates"][0]
    key = create_key(r, capsys, "--name", "one-search", "--budget", "0.015")
    resp = httpx.post(r.url + path, json=body, headers={"x-api-key": key["key"]}, timeout=30)
    assert resp.status_code == 200, resp.text
    row = r.records(1)[-1]
    assert row["cost_tools_usd"] == pytest.approx(0.01), row  # the provider stopped at max_uses
    # Without max_uses, the policy's three are held.
    unbounded = {**body, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    seen = httpx.post(r.url + "/v1/route", json=unbounded, headers={"x-api-key": MASTER}, timeout=30).json()
    assert seen["candidates"][0]["hold_usd"] >= 0.03


def test_replies_longer_than_expected_cannot_spend_past_a_key_budget_at_once(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request held its cost at the 90th percentile of the backend's output (1,024 tokens here,
    $0.0102), while nothing kept it from writing all the output its backend allows: 40 requests
    at once on a key with $0.10, each asking for a long reply (~3,200 tokens, $0.032), were nine
    admitted and spent about three times the budget (a hostile probe: $0.256 of $0.05). A request
    now holds, of what its key has left, as much as it may cost at most (its backend's whole
    output), and no less than before: near the end of a budget fewer run at once (the others are
    told to retry shortly), and what they spend past it is at most one request's output."""
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@big_kb=20"  # ~3,200-token replies
    policy["models"][0]["prices"] = {"input": 1.0, "output": 10.0}  # at most 4,096 output tokens: $0.041
    policy["routes"][0]["candidates"] = ["local-nano"]
    policy["rules"] = []
    # A task's budget holds the 90th percentile still: the key's worst case held there too refused
    # every request that fit it (each of the 40 is a task of its own).
    policy["objective"]["max_cost_per_task"] = 0.02
    r = router_factory(policy, master_key=MASTER)
    body = {"model": "auto", "messages": [{"role": "user", "content": "write a long essay"}]}
    one = httpx.post(r.url + CHAT, json=body, headers={"x-api-key": MASTER}, timeout=30)
    cost = float(one.headers["x-router-cost-usd"])
    assert 0.025 < cost < 0.041
    budget = 0.10
    key = create_key(r, capsys, "--name", "long-replies", "--budget", str(budget))

    statuses, spent = forty_at_once(r, key, body)
    assert 200 in statuses and 429 in statuses
    assert spent <= budget + 4096 * 10e-6, (spent, budget, statuses)


def test_documents_the_provider_fetches_cannot_spend_past_a_key_budget_at_once(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A document named by its URL (or a file by its id) is read by the provider, which bills all
    its pages, while the router sized the request by the name alone (20 tokens): a key's budget
    held at worst $0.000225 for such a request with max_tokens 1, so 40 at once on a key with
    $0.05 were all served, each billed $0.30 (a hostile probe; the fake provider bills each
    fetched document 100,000 tokens). Such a prompt is now held at worst as its backend's whole
    window: near a budget's end one runs at a time, and what it spends past it is one request."""
    policy = local_policy(upstream.url)
    policy["models"][3]["litellm_model"] = "anthropic/claude-local@fetched_tokens=100000"
    policy["routes"][1]["candidates"] = ["local-claude"]
    policy["rules"] = []
    r = router_factory(policy, master_key=MASTER)
    document = {"type": "document", "source": {"type": "url", "url": "https://example.com/report.pdf"}}
    body = {
        "model": "claude-sonnet-4-5", "max_tokens": 1,
        "messages": [{"role": "user", "content": [document, {"type": "text", "text": "summarise it"}]}],
    }  # fmt: skip
    headers = {"x-api-key": MASTER, "anthropic-version": "2023-06-01"}
    one = httpx.post(r.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert one.status_code == 200, one.text
    cost = float(one.headers["x-router-cost-usd"])
    assert 0.29 < cost < 0.31  # what the provider billed is what the router charges
    budget = 0.05
    key = create_key(r, capsys, "--name", "documents", "--budget", str(budget))

    statuses, spent = forty_at_once(r, key, body, "/v1/messages")
    assert 200 in statuses and 429 in statuses, statuses
    assert spent <= budget + cost, (spent, budget, statuses)
