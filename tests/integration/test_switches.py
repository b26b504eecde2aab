"""The switch signals through a real server: a tool loop moves the task off its model once, and
the model it goes to keeps the task while the loop it left behind is still in the window."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_attempt_control import START, send, turn


def same_call(i: int) -> list[dict[str, Any]]:
    """The i-th turn of a loop: the same bash call, the same result."""
    call = {
        "id": f"loop_{i}",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"loop_{i}", "content": "hello.py"},
    ]


@pytest.fixture
def router(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> RunningRouter:
    upstream.clear()
    return router_factory(local_policy(upstream.url))


def test_a_tool_loop_moves_the_task_once_not_back_and_forth(router: RunningRouter) -> None:
    conversation = list(START)
    served = []
    for i in range(3):  # the cheapest model calls `ls` three times: a loop
        r = send(router, conversation, task="looping")
        assert r.status_code == 200, r.text
        served.append(r.headers["x-router-model"])
        conversation += same_call(i)
    assert served == ["local-nano"] * 3
    # The loop moves the task to the next model; it makes progress, and keeps the task (and its
    # warm cache) for as long as the loop it left behind is still among the last messages: before,
    # the loop in the history moved it off each model in turn, back to the one that had looped.
    for i in range(8):
        r = send(router, conversation, task="looping")
        assert r.status_code == 200, r.text
        served.append(r.headers["x-router-model"])
        conversation += turn(i)
    assert served[3:] == ["local-mini"] * 8, served
    # The second model loops as well: the task goes on to the third, not back to the first.
    for i in range(3, 6):
        conversation += same_call(i)
        r = send(router, conversation, task="looping")
        assert r.status_code == 200, r.text
        served.append(r.headers["x-router-model"])
    assert served[-1] == "local-large", served
