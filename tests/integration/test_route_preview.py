"""``/v1/route`` is the proxy's own decision without the call: the task's pin and history count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

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


def test_an_explored_choice_is_labelled_in_the_log_and_on_the_dashboard(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """On a policy that explores every attempt, the proxy's explored picks say so in the log (whose
    reason the console line starts with) and on the task's dashboard page; the others do not."""
    upstream.clear()
    policy = local_policy(upstream.url)
    policy["objective"]["exploration"] = {"epsilon": 1.0, "seed": 5}
    router = router_factory(policy)
    body = {"model": "auto", "messages": [{"role": "user", "content": "say hi"}]}
    with httpx.Client(base_url=router.url, timeout=20) as c:
        served = [
            c.post("/v1/chat/completions", json=body, headers={"x-router-task-id": f"explore-{i}"})
            for i in range(12)
        ]
    assert all(r.status_code == 200 for r in served)
    records = router.records(wait_for=12)
    explored = [r for r in records if r["chosen_model"] != "local-nano"]
    assert explored, "epsilon 1 over four backends explored nothing in 12 attempts"
    for r in explored:
        assert r["decision_reason"].startswith("explored (epsilon 1.0); the policy chose local-nano")
    for r in records:
        if r["chosen_model"] == "local-nano":
            assert not r["decision_reason"].startswith("explored")
    page = httpx.get(f"{router.url}/ui/tasks/{explored[0]['task_id']}").text
    assert 'class="tag explored"' in page
    plain = next(r for r in records if r["chosen_model"] == "local-nano")
    assert 'class="tag explored"' not in httpx.get(f"{router.url}/ui/tasks/{plain['task_id']}").text


def test_the_route_preview_shows_the_policys_choice_never_an_exploration(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    # /v1/route explored as the proxy does: the demo printed a random pick as "the decision".
    upstream.clear()
    policy = local_policy(upstream.url)
    policy["objective"]["exploration"] = {"epsilon": 1.0, "seed": 5}
    router = router_factory(policy)
    body = {"model": "auto", "messages": [{"role": "user", "content": "say hi"}]}
    with httpx.Client(base_url=router.url, timeout=20) as c:
        looks = [
            c.post("/v1/route", json=body, headers={"x-router-task-id": f"look-{i}"}).json()
            for i in range(12)
        ]
    assert {(p["chosen"], p["explored"], p["propensity"]) for p in looks} == {("local-nano", False, 1.0)}
    assert all(p["reason"].startswith("cheapest") for p in looks)
