"""Control inside the attempt, through a real server: a model's call cap stops the attempt with an
error in the caller's protocol naming the rule, and the task's next attempt escalates."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}  # fmt: skip
START = [
    {"role": "system", "content": "You are a coding agent. Fix the issue."},
    {"role": "user", "content": "The date parser crashes on leap years; fix it."},
]


def turn(i: int) -> list[dict[str, Any]]:
    """The assistant's i-th bash call and its result, as a tool-calling agent sends them back."""
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "bash", "arguments": f'{{"command": "cat file{i}.py"}}'},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"file{i}.py"},
    ]


def send(
    router: RunningRouter, messages: list[dict[str, Any]], task: str = "leap-year-fix"
) -> httpx.Response:
    return httpx.post(
        router.url + "/v1/chat/completions",
        json={"model": "auto", "messages": messages, "tools": [BASH]},
        headers={"authorization": "Bearer sk-test", "x-router-task-id": task},
        timeout=30,
    )


def report_failure(router: RunningRouter, task: str) -> dict[str, Any]:
    r = httpx.post(router.url + "/v1/outcomes", json={"task_id": task, "success": False}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture
def capped(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> RunningRouter:
    upstream.clear()
    policy = local_policy(upstream.url)
    for m in policy["models"]:
        if m["id"] == "local-nano":
            m["max_calls_per_attempt"] = 2
    return router_factory(policy)


def test_a_capped_attempt_is_stopped_and_the_next_attempt_escalates(capped: RunningRouter) -> None:
    conversation = list(START)
    for i in range(2):  # the cap: two calls on the cheapest model
        r = send(capped, conversation)
        assert r.status_code == 200 and r.headers["x-router-model"] == "local-nano", r.text
        conversation += turn(i)
    stopped = send(capped, conversation)
    assert stopped.status_code == 400
    error = stopped.json()["error"]
    assert error["code"] == "attempt_stopped" and error["param"] == "max_calls_per_attempt"
    assert "models.local-nano.max_calls_per_attempt (2)" in error["message"]
    # What comes next, in words and as a field: no learned plan here, so the decider's own choice.
    assert error["message"].endswith("start the task again: its next attempt goes to local-mini")
    assert error["next"] == {
        "retry": True,
        "model": "local-mini",
        "expected_success": None,
        "expected_cost_usd": None,
    }
    # Going on in the same attempt is told the same: the attempt is over.
    conversation += turn(2)
    again = send(capped, conversation)
    assert again.status_code == 400 and again.json()["error"] == error
    # The task's status says the same, and so does the failure reported on the stopped attempt.
    status = httpx.get(capped.url + "/v1/tasks/leap-year-fix", timeout=30)
    assert status.status_code == 200, status.text
    assert status.json()["stopped"] == {"attempt": 1, "rule": "max_calls_per_attempt", "next": error["next"]}
    reported = report_failure(capped, "leap-year-fix")
    assert reported["attempt"] == 1 and reported["next"] == error["next"]
    # The agent starts the task over: a new attempt, on the next model (nano failed the task).
    restarted = send(capped, list(START))
    assert restarted.status_code == 200, restarted.text
    assert restarted.headers["x-router-model"] == "local-mini"
    # The new attempt's calls are counted afresh (no cap on local-mini).
    follow = send(capped, [*START, *turn(0), *turn(1), *turn(2)])
    assert follow.status_code == 200 and follow.headers["x-router-model"] == "local-mini"


def test_max_calls_per_attempt_is_validated(tmp_path: Any) -> None:
    import yaml

    from router.errors import ConfigError
    from router.policy.loading import load_policy

    policy = local_policy("http://127.0.0.1:9")
    policy["models"][0]["max_calls_per_attempt"] = 0
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(policy))
    with pytest.raises(ConfigError, match=r"max_calls_per_attempt"):
        load_policy(path)


ANTHROPIC_START = [{"role": "user", "content": "The date parser crashes on leap years; fix it."}]
ANTHROPIC_TOOL = {"name": "bash", "description": "Run a command",
                  "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}  # fmt: skip


def anthropic_turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": f"tu_{i}", "name": "bash",
                                           "input": {"command": f"cat file{i}.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu_{i}", "content": f"file{i}.py"}]},
    ]  # fmt: skip


def test_an_anthropic_client_is_told_the_rule_and_what_comes_next_in_its_own_error_shape(
    capped: RunningRouter,
) -> None:
    conversation = list(ANTHROPIC_START)
    for i in range(3):
        r = httpx.post(
            capped.url + "/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": conversation,
                  "tools": [ANTHROPIC_TOOL]},
            headers={"x-api-key": "sk-test", "anthropic-version": "2023-06-01", "x-router-task-id": "anthropic-leap"},
            timeout=30,
        )  # fmt: skip
        conversation += anthropic_turn(i)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    error = body["error"]
    assert (error["code"], error["param"]) == ("attempt_stopped", "max_calls_per_attempt")
    assert (
        error["next"]["model"] == "local-mini" and "its next attempt goes to local-mini" in error["message"]
    )


def learned_policy(upstream_url: str, tmp_path: Path, max_attempts: int) -> dict[str, Any]:
    """The local policy planning with a small trained artifact in which only local-large solves
    the task (its first attempt goes there), capped at two calls on local-large."""
    from router.features.task.vector import task_vector
    from router.learning.training.dataset import AttemptRow
    from router.learning.training.fit import fit

    vec = task_vector(START[1]["content"], START[0]["content"], 1)
    good = {"local-large": True, "local-claude": True}
    rows = [
        AttemptRow(f"t{i}", 1, m, vec, good.get(m, False) and (m == "local-large" or i % 3 == 0), "explicit",
                   0.01, 3, 1.0, [m])
        for i in range(12) for m in ("local-nano", "local-mini", "local-large", "local-claude")
    ]  # fmt: skip
    raw = fit(rows).to_json()
    path = tmp_path / "learned.json"
    path.write_bytes(raw)
    policy = local_policy(upstream_url)
    policy["learned"] = {"artifact": str(path), "sha256": hashlib.sha256(raw).hexdigest()}
    policy["objective"]["max_attempts"] = max_attempts
    for m in policy["models"]:
        if m["id"] == "local-large":
            m["max_calls_per_attempt"] = 2
    return policy


def test_a_stopped_attempt_names_the_learned_plans_next_model_and_the_outcome_agrees(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, tmp_path: Path
) -> None:
    router = router_factory(learned_policy(upstream.url, tmp_path, max_attempts=3))
    conversation = list(START)
    for i in range(2):
        r = send(router, conversation, "learned-leap")
        assert r.status_code == 200 and r.headers["x-router-model"] == "local-large", r.text
        conversation += turn(i)
    stopped = send(router, conversation, "learned-leap")
    assert stopped.status_code == 400, stopped.text
    error = stopped.json()["error"]
    nxt = error["next"]
    assert nxt["retry"] is True and nxt["model"] not in (None, "local-large")
    assert 0 < nxt["expected_success"] <= 1 and nxt["expected_cost_usd"] > 0
    assert f"its next attempt goes to {nxt['model']} (the plan from there: " in error["message"]
    assert report_failure(router, "learned-leap")["next"] == nxt
    assert httpx.get(router.url + "/v1/tasks/learned-leap", timeout=30).json()["stopped"]["next"] == nxt
    # The next attempt goes where it was told.
    restarted = send(router, list(START), "learned-leap")
    assert restarted.status_code == 200 and restarted.headers["x-router-model"] == nxt["model"]


def test_a_stopped_last_attempt_says_no_further_attempt_is_planned(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, tmp_path: Path
) -> None:
    router = router_factory(learned_policy(upstream.url, tmp_path, max_attempts=1))
    conversation = list(START)
    for i in range(3):
        r = send(router, conversation, "one-shot")
        conversation += turn(i)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["next"] == {"retry": False, "model": None, "expected_success": 0.0, "expected_cost_usd": 0.0}
    assert "no further attempt is planned" in error["message"]
    assert report_failure(router, "one-shot")["next"] == error["next"]


def test_an_outcome_of_an_attempt_that_never_ran_is_a_404_and_not_recorded(router: RunningRouter) -> None:
    """A verdict on attempt 5 of a task whose only attempt is 1 was stored: training joins
    outcomes to attempts by number, so it labelled the task's fifth attempt before any ran."""
    assert send(router, START, task="one-attempt").status_code == 200
    post = {"task_id": "one-attempt", "success": True}
    refused = httpx.post(router.url + "/v1/outcomes", json={**post, "attempt": 5}, timeout=30)
    assert refused.status_code == 404, refused.text
    err = refused.json()["error"]
    assert err["code"] == "attempt_not_found" and err["param"] == "attempt"
    assert "no attempt 5: its latest is attempt 1" in err["message"]
    # The attempt that ran takes its verdict, named or not, and only it is in the log.
    for body in ({**post, "attempt": 1}, post):
        took = httpx.post(router.url + "/v1/outcomes", json=body, timeout=30)
        assert took.status_code == 200 and took.json()["attempt"] == 1, took.text
    with sqlite3.connect(router.db_path) as con:
        attempts = {a for (a,) in con.execute("SELECT attempt FROM outcomes WHERE task_id = 'one-attempt'")}
    assert attempts == {1}
