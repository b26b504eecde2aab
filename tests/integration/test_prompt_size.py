"""The proxy's prompt size end to end: exact where a limit is near, remembered per task, resends noticed."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from router.features import request as features
from router.features.tokens import TokenCounter
from router.protocols import openai_chat
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration


def body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i} of the output\n" * 40}
        )
    return {"model": "auto", "messages": messages}


def exact(b: dict[str, Any]) -> int:
    import orjson

    return features.count_prompt_tokens(openai_chat.parse(orjson.dumps(b)), TokenCounter())


def post(router: RunningRouter, b: dict[str, Any], task: str) -> httpx.Response:
    r = httpx.post(
        router.url + "/v1/chat/completions", json=b, headers={"x-router-task-id": task}, timeout=20
    )
    assert r.status_code == 200, r.text
    return r


def outcome_sources(router: RunningRouter, task: str, timeout: float = 5.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        con = sqlite3.connect(router.db_path)
        try:
            rows = {r[0] for r in con.execute("SELECT source FROM outcomes WHERE task_id = ?", (task,))}
        except sqlite3.OperationalError:
            rows = set()
        finally:
            con.close()
        if rows or time.monotonic() > deadline:
            return rows


def test_a_rule_on_the_prompt_size_is_decided_on_the_exact_count(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    b = body(3)
    n = exact(b)
    # The threshold sits inside the estimate's bounds: the router must count before deciding.
    rule = {"name": "long", "when": {"prompt_tokens": {"$gt": n - 5}}, "only": ["local-large"]}
    r = router_factory(local_policy(upstream.url, rules=[rule]))
    assert post(r, b, "sized").headers["x-router-model"] == "local-large"
    rows = r.records()
    assert rows[-1]["prompt_tokens_est"] == n


def test_an_identical_request_sent_again_is_a_weak_failure(router: RunningRouter) -> None:
    post(router, body(2), "again")
    post(router, body(3), "again")
    assert "resent" not in outcome_sources(router, "again", timeout=0.5)
    post(router, body(3), "again")
    assert "resent" in outcome_sources(router, "again")


def test_an_unchanged_weak_label_is_stored_once(router: RunningRouter) -> None:
    def stamp() -> float:
        con = sqlite3.connect(router.db_path)
        try:
            row = con.execute("SELECT ts FROM outcomes WHERE task_id = 'once' AND source = 'resent'")
            return float(row.fetchone()[0])
        finally:
            con.close()

    post(router, body(3), "once")
    post(router, body(3), "once")
    assert "resent" in outcome_sources(router, "once")
    first = stamp()
    post(router, body(3), "once")  # the same label again: not written a second time
    post(router, body(4), "once")  # a request after it, so the third one's label task has run
    router.records(wait_for=4)
    assert stamp() == first


def test_the_next_request_is_sized_exactly_once_the_deferred_count_is_done(router: RunningRouter) -> None:
    first = body(4)
    post(router, first, "grow")
    # The first turn's exact count is made off the request path; the next turn then reuses it.
    nxt = body(5)
    deadline = time.monotonic() + 5
    while True:
        post(router, nxt, "grow")
        rows = router.records(wait_for=2)
        if rows[-1]["prompt_tokens_est"] == exact(nxt) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rows[-1]["prompt_tokens_est"] == exact(nxt)


def test_a_short_new_message_is_counted_once_the_reply_is_out(router: RunningRouter) -> None:
    first = body(1)
    post(router, first, "short")
    # A short new turn of ~3 characters per token: the estimate (3.6 until counts say otherwise) misses.
    nxt = {**first, "messages": [*first["messages"], {"role": "user", "content": "ok " * 100}]}
    post(router, nxt, "short")  # its new message is estimated, then counted after the reply
    post(router, nxt, "short")  # sent again: every part is now known exactly
    rows = router.records(wait_for=3)
    assert rows[-2]["prompt_tokens_est"] != exact(nxt)
    assert rows[-1]["prompt_tokens_est"] == exact(nxt)
