"""Background work: tracked tasks, and worker threads that give way to the event loop."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from router.background import WORKER_NICENESS, Background, worker_pool


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_worker_threads_run_nicer_than_the_thread_that_made_them() -> None:
    with worker_pool("test-worker", max_workers=1) as pool:
        worker = pool.submit(_niceness).result()
    assert worker == min(19, _niceness() + WORKER_NICENESS)


async def test_blocking_work_runs_on_a_worker_thread_and_is_drained() -> None:
    tasks = Background()
    started = threading.Event()

    def work(x: int) -> tuple[int, str]:
        started.set()
        return x * 2, threading.current_thread().name

    task = tasks.spawn_blocking(work, 21, name="double")
    assert len(tasks) == 1
    await tasks.drain(5.0)
    value, thread = task.result()
    assert value == 42 and thread.startswith("router-worker")
    assert len(tasks) == 0 and started.is_set()


async def test_a_failing_blocking_call_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    tasks = Background()

    def boom() -> None:
        raise ValueError("no")

    tasks.spawn_blocking(boom, name="boom")
    await tasks.drain(5.0)
    await asyncio.sleep(0)
    assert "background task 'boom' failed" in caplog.text
