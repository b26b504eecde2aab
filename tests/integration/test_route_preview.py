"""``/v1/route`` is the proxy's own decision without the call: the task's pin and history count."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def turn(n: int) -> dict[str, Any]:
    """The agent's ``n``-th call: the same task, a longer conversation each time."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the flaky test in test_io.py"}]
    for i in range(n - 1):
        messages += [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i}"},
        ]  # fmt: skip
    return {"model": "auto", "messages": messages, "tools": TOOLS}


def test_the_preview_sees_the_tasks_pin_and_changes_nothing(router: RunningRouter) -> None:
    task = {"x-router-task-id": "preview-task"}
    with httpx.Client(base_url=router.url, timeout=20) as c:
        fresh = c.post("/v1/route", json=turn(1), headers=task).json()
        assert fresh["pinned"] is None and fresh["attempt"] == 1 and fresh["task_id"] == "preview-task"
        # A preview remembers nothing: the proxy's first call still starts the task.
        served = c.post("/v1/chat/completions", json=turn(1), headers=task)
        assert served.status_code == 200
        model = served.headers["x-router-model"]
        # The task is pinned where it started: the preview says so, as the proxy's next call does.
        preview = c.post("/v1/route", json=turn(2), headers=task).json()
        assert (preview["pinned"], preview["chosen"]) == (model, model)
        assert preview["reason"].startswith(f"pinned to {model}")
        after = c.post("/v1/chat/completions", json=turn(2), headers=task)
        assert after.headers["x-router-model"] == model
        # A new attempt announced in the header is previewed without being opened.
        again = c.post("/v1/route", json=turn(1), headers={**task, "x-router-attempt": "2"}).json()
        assert (again["attempt"], again["pinned"]) == (2, None)
        assert c.post("/v1/route", json=turn(3), headers=task).json()["attempt"] == 1
