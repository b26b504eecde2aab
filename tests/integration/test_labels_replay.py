"""Real agent runs replayed through a running router: its live verdict is the offline one.

Each request a trajectory's agent sent goes to the proxy (tool-calling shape and text shape);
``GET /v1/tasks/{id}`` must then report the label `router eval-labels` computes for the last
request offline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from router.fakeupstream import FakeUpstream
from router.features.labels import default
from router.features.labels.model import SOURCE
from router.learning.labels.replay import load, replay, requests
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

TRAJECTORIES = Path(__file__).resolve().parents[2] / "evals/data/trajectories/gemini-3-pro-preview.jsonl.gz"


def verdict(router: RunningRouter, task: str, score: float, timeout: float = 10.0) -> dict[str, Any] | None:
    """The task's verdict once it shows ``score`` (the labels are written off the request path)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{router.url}/v1/tasks/{task}", timeout=10)
        outcome = r.json().get("outcome") if r.status_code == 200 else None
        if (outcome is not None and outcome["score"] == score) or time.monotonic() > deadline:
            return outcome
        time.sleep(0.05)


@pytest.mark.parametrize("shape", ["tools", "text"])
def test_the_live_verdict_on_replayed_runs_equals_the_offline_one(router: RunningRouter, shape: str) -> None:
    # A resolved and an unresolved run, short enough to replay quickly.
    runs = sorted(load(TRAJECTORIES, limit=40), key=lambda t: len(t.messages))
    picked = [next(t for t in runs if t.resolved), next(t for t in runs if not t.resolved)]
    with httpx.Client(timeout=30) as client:
        for t in picked:
            task = f"{shape}-{t.instance_id}"
            for body in requests(t, shape, model="auto"):
                r = client.post(f"{router.url}/v1/chat/completions", content=body,
                                headers={"x-router-task-id": task, "content-type": "application/json"})  # fmt: skip
                assert r.status_code == 200, r.text
    for t in picked:
        offline = replay(t, shape, default())[-1].label
        live = verdict(router, f"{shape}-{t.instance_id}", offline.score)
        assert live is not None, f"no verdict for {t.instance_id}"
        assert (live["source"], live["success"], live["score"], live["explicit"]) == (
            SOURCE,
            offline.success,
            offline.score,
            False,
        )


def test_a_conversation_first_seen_whole_gets_the_same_verdict(router: RunningRouter) -> None:
    # A restart, or a task joined midway: the router sees a long conversation at once and reads
    # it on a worker thread (its turns, one at a time, are read on the event loop).
    t = max(load(TRAJECTORIES, limit=40), key=lambda t: len(t.messages))
    *_, last = requests(t, "tools", model="auto")
    assert len(orjson.loads(last)["messages"]) > 16  # context.INLINE_MESSAGES
    task = f"whole-{t.instance_id}"
    r = httpx.post(f"{router.url}/v1/chat/completions", content=last, timeout=30,
                   headers={"x-router-task-id": task, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text
    offline = replay(t, "tools", default())[-1].label
    live = verdict(router, task, offline.score)
    assert live is not None and (live["success"], live["score"]) == (offline.success, offline.score)


def _stored_score(router: RunningRouter, task: str, other_than: float | None, timeout: float = 10.0) -> float:
    """The task's stored label score, once it differs from ``other_than``."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{router.url}/v1/tasks/{task}", timeout=10)
        outcome = r.json().get("outcome") if r.status_code == 200 else None
        if outcome is not None and outcome["score"] != other_than:
            return float(outcome["score"])
        assert time.monotonic() < deadline, f"no new label for {task}"
        time.sleep(0.05)


@pytest.mark.parametrize("escalate_below", [None, 0.999])
def test_a_low_p_success_moves_the_task_off_its_model_once(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, escalate_below: float | None
) -> None:
    upstream.clear()
    tasks = {} if escalate_below is None else {"tasks": {"escalate_below": escalate_below}}
    router = router_factory(local_policy(upstream.url, **tasks))
    t = min(load(TRAJECTORIES, limit=10), key=lambda t: len(t.messages))
    bodies = list(requests(t, "tools", model="auto"))
    chosen, score = [], None
    with httpx.Client(timeout=30) as client:
        for body in bodies[:4]:
            r = client.post(f"{router.url}/v1/chat/completions", content=body,
                            headers={"x-router-task-id": "esc", "content-type": "application/json"})  # fmt: skip
            assert r.status_code == 200, r.text
            chosen.append(r.headers["x-router-model"])
            if len(chosen) >= 2:  # the first request has no tool result yet: no label
                score = _stored_score(router, "esc", score)  # the next decision sees this label
    if escalate_below is None:
        assert len(set(chosen)) == 1  # the pin holds
        return
    # The label after request 2 is below the bar: request 3 leaves the pinned model, and
    # request 4 stays where it went (once per attempt).
    assert chosen[0] == chosen[1] != chosen[2] == chosen[3], chosen
    excluded = [c.get("excluded") for c in orjson.loads(router.records(wait_for=4)[2]["candidates"])]
    assert "switch: low_p_success" in excluded
