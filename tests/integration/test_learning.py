"""The loop closes: traffic → log → outcomes → `router train` → promoted artifact → better decisions.

A scripted agent works tasks through the proxy against the local upstream. Whether an attempt
succeeds depends on the task and the model, as it would for a real agent: easy tasks (typos,
docstrings) succeed on any model, hard ones (races, deadlocks) only on the large model. The
agent reports results both ways the router reads them: pytest summaries in tool results and
`POST /v1/outcomes`. A failed attempt is retried from the start, up to three attempts.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from router.app.commands.train import train
from router.fakeupstream import FakeUpstream
from router.learning.training.estimates import MIN_ROWS
from router.rollout.promote import promote
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

EASY = ["typo", "docstring", "rename", "spelling", "comment", "readme", "wording", "label"]
HARD = ["race", "deadlock", "concurrency", "distributed", "lock", "thread", "consistency", "atomic"]
FILLER = ["module", "function", "class", "test", "value", "config", "request", "user", "file", "error"]
SYSTEM = "You are a coding agent. Use the bash tool to inspect and fix the repository."
BASH = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                "required": ["command"]}},
}  # fmt: skip


def make_task(rng: random.Random, hard: bool, n: int) -> str:
    words = rng.sample(HARD if hard else EASY, 4) + rng.sample(FILLER, 4)
    rng.shuffle(words)
    return f"Issue #{n}: fix the {' '.join(words)} problem reported by users."


def policy(upstream_url: str, epsilon: float) -> dict[str, Any]:
    base = f"{upstream_url}/v1"
    models = [
        ("nano", "openai/nano-model", 1.0, 4.0),
        ("mini", "openai/mini-model", 2.0, 8.0),
        ("large", "openai/large-model", 4.0, 16.0),
    ]
    return {
        "name": "learning-test",
        "models": [
            {
                "id": i,
                "litellm_model": m,
                "protocol": "openai",
                "api_base": base,
                "context_window": 100000,
                "max_output_tokens": 4096,
                "prices": {"input": pin, "output": pout, "cache_read": pin},
            }
            for i, m, pin, pout in models
        ],
        "routes": [{"match": "auto", "candidates": ["nano", "mini", "large"]}],
        "objective": {"max_attempts": 3, "exploration": {"epsilon": epsilon, "seed": 11}},
    }


@dataclass
class Result:
    completed: int = 0
    tasks: int = 0
    cost: float = 0.0
    requests: int = 0

    @property
    def success(self) -> float:
        return self.completed / self.tasks

    @property
    def cost_per_completed(self) -> float:
        return self.cost / max(self.completed, 1)


def run_task(router: RunningRouter, text: str, hard: bool, task_id: str) -> tuple[bool, int]:
    """One task, up to three attempts; returns whether it was completed and the requests it made."""
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="agent-key", max_retries=0, timeout=20)
    for attempt in range(1, 4):
        msgs: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        headers = {"x-router-task-id": task_id}
        first = client.chat.completions.with_raw_response.create(
            model="auto", messages=msgs, tools=[BASH], extra_headers=headers
        )
        model = first.headers["x-router-model"]
        call = first.parse().choices[0].message.tool_calls[0]  # type: ignore[index]
        ok = model == "large" or not hard
        summary = "===== 6 passed in 0.41s =====" if ok else "===== 2 failed, 4 passed in 0.52s ====="
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": f"$ pytest -q\n....\n{summary}"},
        ]
        client.chat.completions.create(model="auto", messages=msgs, tools=[BASH], extra_headers=headers)
        r = httpx.post(
            router.url + "/v1/outcomes", json={"task_id": task_id, "success": ok, "attempt": attempt}
        )
        assert r.status_code == 200, r.text
        if ok:
            return True, 2 * attempt
        assert "next" in r.json(), r.json()  # a failure is answered with a recommendation (or null)
    return False, 6


def run_all(router: RunningRouter, tasks: list[tuple[str, bool]], prefix: str) -> Result:
    res = Result()
    for i, (text, hard) in enumerate(tasks):
        res.tasks += 1
        completed, requests = run_task(router, text, hard, f"{prefix}-{i}")
        res.completed += completed
        res.requests += requests
    # The writer batches: wait until every request made is in the log, or the cost is short.
    rows = router.records(wait_for=res.requests)
    assert len(rows) >= res.requests, f"{len(rows)} of {res.requests} requests logged"
    res.cost = sum(r["cost_usd"] or 0 for r in rows if (r["task_id"] or "").startswith(prefix))
    return res


def test_learning_lowers_cost_per_completed_task(
    router_factory, upstream: FakeUpstream, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    train_tasks = [(make_task(rng, i % 2 == 1, i), i % 2 == 1) for i in range(60)]
    fresh_tasks = [(make_task(rng, i % 2 == 1, 1000 + i), i % 2 == 1) for i in range(20)]

    # 1. The starting policy (cheapest, exploring) works the training tasks; the log fills.
    explorer = router_factory(policy(upstream.url, epsilon=0.5))
    run_all(explorer, train_tasks, "train")  # returns once every request is in the log
    store = f"sqlite:///{explorer.db_path}"
    config = explorer.db_path.parent / "policy.yaml"

    # 2. `router train` on that log, and the off-policy estimate agrees in direction.
    out = tmp_path / "learned" / "p.json"
    trained = train(store, str(config), str(out))
    ope = trained.artifact.report["offpolicy"]
    assert ope["new_snips"]["cost_per_completed"] < ope["logged"]["cost_per_completed"]
    assert ope["new_snips"]["success"] >= ope["logged"]["success"]

    # 3. Promote into a running router: picked up without a restart, visible in /v1/route.
    baseline_policy = policy(upstream.url, epsilon=0.0)
    learned_router = router_factory(baseline_policy)
    learned_config = learned_router.db_path.parent / "policy.yaml"
    promote(str(out), str(learned_config))
    hard_body = {"model": "auto", "tools": [BASH], "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": fresh_tasks[1][0]}]}  # fmt: skip
    deadline = time.monotonic() + 5
    while True:
        route = httpx.post(learned_router.url + "/v1/route", json=hard_body).json()
        if route["policy"].startswith("learning-test/learned:") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert route["policy"].startswith("learning-test/learned:"), route
    by_model = {c["model"]: c for c in route["candidates"]}
    assert by_model["large"]["p_success"] > by_model["nano"]["p_success"]
    assert {"p_success", "attempt_cost_usd", "cost_per_completed_usd"} <= set(by_model["nano"])
    assert route["chosen"] == "large", route
    # Each candidate is priced by what the log taught (issue 33), not the policy's flat default.
    learned = trained.artifact.estimates
    for model, c in by_model.items():
        mean, p90 = learned.output_mean(model, c.get("output_cell")), learned.of(model).output_p90
        assert mean is not None and p90 is not None, (model, learned.of(model))
        assert c["output_tokens"] == max(1, round(mean)) != 1024, (model, c)
        assert c.get("hold_usd", c["cost_usd"]) > c["cost_usd"] or p90 <= mean, (model, c)

    # A harness asks after a failure whether another attempt is worth it, and on which model.
    task = "next-after-failure"
    client = openai.OpenAI(
        base_url=learned_router.url + "/v1", api_key="agent-key", max_retries=0, timeout=20
    )
    first = client.chat.completions.with_raw_response.create(
        model="auto", messages=hard_body["messages"], tools=[BASH], extra_headers={"x-router-task-id": task}
    )
    tried = first.headers["x-router-model"]
    r = httpx.post(
        learned_router.url + "/v1/outcomes", json={"task_id": task, "success": False, "attempt": 1}
    )
    nxt = r.json()["next"]
    assert nxt["retry"] is True and nxt["model"] in {"nano", "mini", "large"}, nxt
    assert 0 < nxt["expected_success"] <= 1 and nxt["expected_cost_usd"] > 0, nxt
    # The recommendation is the one the router then serves for the next attempt.
    again = client.chat.completions.with_raw_response.create(
        model="auto", messages=hard_body["messages"], tools=[BASH],
        extra_headers={"x-router-task-id": task, "x-router-attempt": "2"},
    )  # fmt: skip
    assert again.headers["x-router-model"] == nxt["model"], (tried, nxt)

    # 4. Fresh tasks of the same kind: the learned policy against the starting one (no exploration).
    cheapest_router = router_factory(baseline_policy)
    before = run_all(cheapest_router, fresh_tasks, "before")
    after = run_all(learned_router, fresh_tasks, "after")
    print(f"\nbefore: {before}\nafter: {after}\noff-policy: {ope}")
    assert after.success >= before.success
    assert after.cost_per_completed < before.cost_per_completed * 0.9, (before, after)


def test_a_log_without_outcomes_still_teaches_the_sizes_of_a_call(
    router_factory, upstream: FakeUpstream, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Nobody reports outcomes: `router train` learns each backend's sizes anyway (it refused, and
    every call stayed priced at the flat 1,024 output), `router promote` pins them, and /v1/route
    prices at the learned mean and holds at the 90th percentile while routing as before."""
    ids = ("nano", "mini", "large")
    served = router_factory(policy(upstream.url, epsilon=0.0) | {"routes": [
        {"match": "auto", "candidates": list(ids)}, *({"match": m, "passthrough": m} for m in ids)]})  # fmt: skip
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="agent-key", max_retries=0, timeout=20)
    rng = random.Random(3)
    for i in range(MIN_ROWS):
        for m in ids:
            task: Any = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": make_task(rng, False, i)},
            ]
            client.chat.completions.create(
                model=m, messages=task, extra_headers={"x-router-task-id": f"{m}-{i}"}
            )
    served.records(wait_for=MIN_ROWS * len(ids))
    store = f"sqlite:///{served.db_path}"
    out = tmp_path / "sizes.json"
    trained = train(store, str(served.db_path.parent / "policy.yaml"), str(out))
    assert not trained.artifact.models and set(trained.artifact.estimates.learned) == set(ids)

    learned_router = router_factory(policy(upstream.url, epsilon=0.0))
    config = learned_router.db_path.parent / "policy.yaml"
    promote(str(out), str(config))
    body = {"model": "auto", "messages": [{"role": "user", "content": make_task(rng, True, 99)}]}
    deadline = time.monotonic() + 5
    while True:
        route = httpx.post(learned_router.url + "/v1/route", json=body).json()
        if route["policy"] == f"learning-test/cheapest:{trained.sha256[:12]}" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert route["policy"] == f"learning-test/cheapest:{trained.sha256[:12]}", route
    learned = trained.artifact.estimates
    for c in route["candidates"]:
        mean, p90 = learned.output_mean(c["model"], c.get("output_cell")), learned.of(c["model"]).output_p90
        assert mean is not None and p90 is not None and c["output_tokens"] == max(1, round(mean)) != 1024, c
        assert c.get("hold_usd", c["cost_usd"]) > c["cost_usd"] or p90 <= mean, c
    assert route["chosen"] == "nano", route  # the cheapest, as with no artifact
