"""The stop-loss learned from the log (issue 31): each main-loop call of an attempt logs the label
model's P(success) that the stop rule read at it, and `router train` fits each model's threshold
from the logged attempts and their explicit outcomes, with the rule it applies to recorded runs:
a threshold where the readings tell failing attempts apart, none where they are noise.

Agents' conversations go through the real app in this process (``tests.unit.inprocess``), read by
the label model the policy pins: one that reads the latest test run (0.73 when it passed, 0.27 when
it failed). The two kinds of conversation are as long, so their attempts cost the same: a reading
that says nothing of the outcome cannot pay for itself by stopping the dearer attempts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.app.cli import main
from router.fakeupstream import FakeUpstream
from router.features.labels.model import LabelModel
from router.learning.training import dataset, stoploss
from router.protocols import OPENAI_CHAT
from router.store import RequestRecord
from tests.unit.inprocess import PATHS, serving
from tests.unit.requestpath import model

TASKS = 40  # stoploss.MIN_RUNS: the rule's own minimum
CALLS = 6
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}  # fmt: skip
#: Reads one fact of the conversation: did its latest test run fail?
LABELS = LabelModel(("tests_failing",), (0.5,), (0.5,), (-1.0,), 0.0, (1.0, 0.0))


def conversation(task: int, calls_made: int, failing: bool) -> list[dict[str, Any]]:
    """The agent's conversation before its call ``calls_made`` (0-based) of the task's attempt."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Fix the issue."},
        {"role": "user", "content": f"The date parser of module_{task} crashes on leap years; fix it."},
    ]
    for i in range(calls_made):
        run = {"command": "python -m pytest -q tests/test_dates.py"}
        # As long either way: the attempts cost the same, only the label's reading tells them apart.
        out = f"{1 + i} failed, 7 passed in 0.1{i}s" if failing else f"{1 + i} skipped, 7 passed in 0.1{i}s"
        msgs += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": orjson.dumps(run).decode()}}
            ]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": out},
        ]  # fmt: skip
    return msgs


async def logged(
    tmp: Path, fake: FakeUpstream, success: Callable[[int, bool], bool]
) -> tuple[list[RequestRecord], list[dataset.AttemptRow]]:
    """Each of ``TASKS`` tasks (every other one failing its tests) makes one attempt of ``CALLS``
    calls through the router, then reports ``success(task, failing)``: the log and its attempts."""
    labels = tmp / "labels.json"
    labels.write_bytes(LABELS.to_json())
    pinned = {"tasks": {"label_model": {"artifact": str(labels), "sha256": LABELS.sha256}}}
    async with serving(tmp, [model("solo", fake.url, "text=ok")], policy=pinned) as r:
        for t in range(TASKS):
            failing = t % 2 == 1
            for k in range(CALLS):
                body = {"model": "auto", "messages": conversation(t, k, failing), "tools": [BASH]}
                got = await r.client.post(
                    PATHS[OPENAI_CHAT], json=body, headers={"x-router-task-id": f"task-{t}"}
                )
                assert got.status_code == 200, got.text
            verdict = {"task_id": f"task-{t}", "success": success(t, failing)}
            assert (await r.client.post("/v1/outcomes", json=verdict)).status_code == 200
        requests = await r.records()
        outcomes = await r.s.store.outcomes_since(0.0)
    return requests, dataset.build(requests, outcomes)


async def test_each_call_logs_the_reading_the_stop_rule_reads(fake: FakeUpstream, tmp_path: Path) -> None:
    requests, _ = await logged(tmp_path, fake, lambda t, failing: not failing)
    by_task: dict[str, list[float | None]] = {}
    for r in sorted(requests, key=lambda r: r.ts):
        by_task.setdefault(r.task_id or "", []).append(r.p_success)
    assert len(by_task) == TASKS
    for t in range(TASKS):
        readings = by_task[f"task-{t}"]
        # The first call has nothing to read; the second reads the first's conversation, which
        # has no tool result yet (nothing is labelled); from the third on, the previous call's label.
        assert readings[:2] == [None, None] and all(p is not None for p in readings[2:]), readings
        read = [p for p in readings[2:] if p is not None]
        assert read == [pytest.approx(0.269 if t % 2 else 0.731, abs=1e-3)] * (CALLS - 2), (t, readings)


async def test_the_call_a_stopped_attempt_refuses_is_logged_with_its_attempt_and_reading(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    labels = tmp_path / "labels.json"
    labels.write_bytes(LABELS.to_json())
    pinned = {"tasks": {"label_model": {"artifact": str(labels), "sha256": LABELS.sha256}}}
    async with serving(
        tmp_path, [model("solo", fake.url, "text=ok", max_calls_per_attempt=2)], policy=pinned
    ) as r:
        for k in range(3):
            body = {"model": "auto", "messages": conversation(1, k, True), "tools": [BASH]}
            got = await r.client.post(PATHS[OPENAI_CHAT], json=body, headers={"x-router-task-id": "capped"})
        assert got.status_code == 400 and got.json()["error"]["code"] == "attempt_stopped", got.text
        rows = sorted(await r.records(), key=lambda r: r.ts)
    assert [(r.status, r.attempt, r.error_type) for r in rows] == [
        (200, 1, None), (200, 1, None), (400, 1, "AttemptStopped")
    ]  # fmt: skip
    # What the cap's rule saw: the label of the second call's conversation (its test run failed).
    assert rows[2].p_success == pytest.approx(0.269, abs=1e-3)


async def test_router_train_fits_a_threshold_from_a_log_whose_readings_tell_failures_apart(
    fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests, attempts = await logged(tmp_path, fake, lambda t, failing: not failing)
    runs = stoploss.runs_from_log(requests, attempts)
    assert set(runs) == {"solo"} and len(runs["solo"]) == TASKS
    one = runs["solo"]["task-1"]
    assert (
        not one.resolved and one.calls == CALLS and one.readings is not None and math.isnan(one.readings[0])
    )
    choice = stoploss.learn(runs)["solo"]
    assert choice.threshold == 0.3 and choice.held_out is not None, choice
    with_, without, random_stop = choice.held_out
    assert with_ < without * 0.98 and with_ < random_stop * 0.98
    # `router train` without --trajectories: the same, from the log, into the artifact.
    out = tmp_path / "learned.json"
    args = ["train", "--store", f"sqlite:///{tmp_path / 'log.db'}", "--config", str(tmp_path / "policy.yaml")]
    assert await asyncio.to_thread(main, [*args, "--out", str(out)]) == 0  # it runs a loop of its own
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "stop-loss per model from the log (label model's P(success) read from call 3 on): solo below 0.3"
        in printed
    )
    art = orjson.loads(out.read_bytes())
    assert art["attempt_control"]["solo"]["stop_below"] == 0.3 and art["stop_loss_from"] == "the log"


async def test_a_log_whose_readings_are_noise_yields_no_threshold(fake: FakeUpstream, tmp_path: Path) -> None:
    # Half of each kind succeeds: what the conversation reads says nothing of how the attempt ends.
    requests, attempts = await logged(tmp_path, fake, lambda t, failing: (t // 2) % 2 == 0)
    runs = stoploss.runs_from_log(requests, attempts)
    assert len(runs["solo"]) == TASKS
    assert sum(r.resolved for r in runs["solo"].values()) == TASKS // 2
    choice = stoploss.learn(runs)["solo"]
    assert choice.threshold is None and choice.reason, choice
