"""When a request's weak label is read (issue 34 #7): at once when the task's next decision reads it
(``escalate_below``, a stop-loss), else once the task's next request is decided, while its backend
answers, or a moment after the request when none comes; at shutdown, before the log closes. The
log gets the same label and the same per-call readings either way (``test_stoploss_log``).

Agents' conversations go through the real app in this process, read by a label model that reads
one fact: whether the latest test run failed (0.27) or not (0.73).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from router.fakeupstream import FakeUpstream
from router.features.labels.model import SOURCE
from router.features.task import unread
from router.protocols import OPENAI_CHAT
from router.store.window import opened
from tests.unit.inprocess import PATHS, Router, serving
from tests.unit.requestpath import model
from tests.unit.test_stoploss_log import BASH, LABELS, conversation


def label_policy(tmp: Path, **tasks: Any) -> dict[str, Any]:
    labels = tmp / "labels.json"
    labels.write_bytes(LABELS.to_json())
    return {"tasks": {"label_model": {"artifact": str(labels), "sha256": LABELS.sha256}, **tasks}}


async def call(r: Router, calls_made: int, failing: bool = True, task: str = "t") -> None:
    body = {"model": "auto", "messages": conversation(1, calls_made, failing), "tools": [BASH]}
    got = await r.client.post(PATHS[OPENAI_CHAT], json=body, headers={"x-router-task-id": task})
    assert got.status_code == 200, got.text


async def test_a_label_no_decision_reads_is_read_once_the_next_request_is_decided(
    fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unread, "LABEL_WAIT_S", 60.0)  # no timer within the test: the requests read it
    async with serving(tmp_path, [model("solo", fake.url, "text=ok")], policy=label_policy(tmp_path)) as r:
        await call(r, 1)  # 4 messages: the first with a tool result, so a label
        state = r.s.tracker.peek("t")
        assert state is not None and state.unread is not None and state.label_at == (0, 0)
        await call(r, 2)  # 6 messages
        # The first call's label was read while the second call's backend answered; the second's waits.
        assert state.label_at == (1, 4) and state.last_label is not None
        assert state.last_label[2] == pytest.approx(0.269, abs=1e-3) and state.unread is not None
        rows = await r.records()
    assert [row.p_success for row in rows][-1] == pytest.approx(0.269, abs=1e-3)


async def test_a_label_is_read_a_moment_after_its_request_when_none_follows(
    fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unread, "LABEL_WAIT_S", 0.01)
    async with serving(tmp_path, [model("solo", fake.url, "text=ok")], policy=label_policy(tmp_path)) as r:
        await call(r, 1)
        state = r.s.tracker.peek("t")
        assert state is not None
        for _ in range(100):
            if state.unread is None:
                break
            await asyncio.sleep(0.01)
        assert state.unread is None and state.label_at == (1, 4)


async def test_a_label_the_next_decision_reads_is_read_when_its_request_ends(
    fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unread, "LABEL_WAIT_S", 60.0)
    policy = label_policy(tmp_path, escalate_below=0.1)
    async with serving(tmp_path, [model("solo", fake.url, "text=ok")], policy=policy) as r:
        await call(r, 1)
        state = r.s.tracker.peek("t")
        assert state is not None and state.unread is None and state.label_at == (1, 4)


async def test_the_labels_not_read_yet_are_logged_at_shutdown(
    fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unread, "LABEL_WAIT_S", 60.0)
    async with serving(tmp_path, [model("solo", fake.url, "text=ok")], policy=label_policy(tmp_path)) as r:
        await call(r, 1, failing=False, task="a")
        await call(r, 1, failing=True, task="b")
        assert r.s.tracker.peek("a").unread is not None  # type: ignore[union-attr]
    async with opened(f"sqlite:///{tmp_path / 'log.db'}") as store:
        labels = {o.task_id: o for o in await store.outcomes_since(0.0)}
    assert set(labels) == {"a", "b"} and {o.source for o in labels.values()} == {SOURCE}
    assert labels["a"].score == pytest.approx(0.731, abs=1e-3) and labels["b"].score == pytest.approx(
        0.269, abs=1e-3
    )
