"""Control inside the attempt, through a real server: a model's call cap stops the attempt with an
error in the caller's protocol naming the rule, and the task's next attempt escalates."""

from __future__ import annotations

from collections.abc import Callable
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


def send(router: RunningRouter, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        router.url + "/v1/chat/completions",
        json={"model": "auto", "messages": messages, "tools": [BASH]},
        headers={"authorization": "Bearer sk-test", "x-router-task-id": "leap-year-fix"},
        timeout=30,
    )


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
    assert "next model" in error["message"]
    # Going on in the same attempt is told the same: the attempt is over.
    conversation += turn(2)
    again = send(capped, conversation)
    assert again.status_code == 400 and again.json()["error"]["code"] == "attempt_stopped"
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
