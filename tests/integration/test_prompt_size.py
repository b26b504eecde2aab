"""The proxy's prompt size end to end: exact where a limit is near, remembered per task, resends noticed."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import httpx
import orjson
import pytest

from router.features.tokens import TokenCounter
from router.protocols import openai_chat
from tests.integration.conftest import RunningRouter

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

    return TokenCounter().count_request(openai_chat.parse(orjson.dumps(b)))


def post(router: RunningRouter, b: dict[str, Any], task: str) -> httpx.Response:
    r = httpx.post(
        router.url + "/v1/chat/completions", json=b, headers={"x-router-task-id": task}, timeout=20
    )
    assert r.status_code == 200, r.text
    return r


def stored_labels(router: RunningRouter, task: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The details of the task's stored inferred labels, once there is one (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        con = sqlite3.connect(router.db_path)
        try:
            query = "SELECT details FROM outcomes WHERE task_id = ? AND NOT explicit"
            rows = [orjson.loads(r[0]) for r in con.execute(query, (task,))]
        except sqlite3.OperationalError:
            rows = []
        finally:
            con.close()
        if rows or time.monotonic() > deadline:
            return rows


def outcome_signals(router: RunningRouter, task: str, timeout: float = 5.0) -> set[str]:
    """The signals named in the task's stored label, once ``resent`` is among them (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {n for d in stored_labels(router, task, timeout) for n in d.get("signals", ())}
        if "resent" in found or time.monotonic() > deadline:
            return found


def test_an_identical_request_sent_again_is_noted_in_the_label(router: RunningRouter) -> None:
    post(router, body(2), "again")
    post(router, body(3), "again")
    assert "resent" not in outcome_signals(router, "again", timeout=0.5)
    post(router, body(3), "again")
    assert "resent" in outcome_signals(router, "again")


def test_an_unchanged_weak_label_is_stored_once(router: RunningRouter) -> None:
    def stamp() -> float:
        con = sqlite3.connect(router.db_path)
        try:
            row = con.execute("SELECT ts FROM outcomes WHERE task_id = 'once' AND NOT explicit")
            return float(row.fetchone()[0])
        finally:
            con.close()

    post(router, body(3), "once")
    post(router, body(3), "once")
    assert "resent" in outcome_signals(router, "once")
    first = stamp()
    post(router, body(3), "once")  # the same label again: not written a second time
    # A label of another task stored after it: the third request's label task has run by then.
    post(router, body(4), "barrier")
    assert stored_labels(router, "barrier")
    router.records(wait_for=4)
    assert stamp() == first


def test_the_next_request_starts_from_the_providers_count_of_the_last(router: RunningRouter) -> None:
    first, nxt = body(4), body(5)
    post(router, first, "grow")
    post(router, first, "grow")  # sent again: sized exactly as the provider counted it
    post(router, nxt, "grow")  # the provider's count of the first, plus an estimate of what is new
    rows = router.records(wait_for=3)
    reported = rows[0]["input_tokens"]
    # The fake upstream counts a quarter of the characters: not what tiktoken counts.
    assert not rows[0]["usage_estimated"] and reported != exact(first)
    assert rows[1]["prompt_tokens_est"] == reported
    new = nxt["messages"][len(first["messages"]) :]
    assert reported < rows[2]["prompt_tokens_est"] < reported + len(orjson.dumps(new))


def test_a_short_new_message_is_sized_from_the_providers_count(router: RunningRouter) -> None:
    first = body(1)
    post(router, first, "short")
    nxt = {**first, "messages": [*first["messages"], {"role": "user", "content": "ok " * 100}]}
    post(router, nxt, "short")  # its new message is estimated: nothing is tokenized
    post(router, nxt, "short")  # sent again: the provider's count of the last request
    rows = router.records(wait_for=3)
    assert rows[2]["prompt_tokens_est"] == rows[1]["input_tokens"] != exact(nxt)
