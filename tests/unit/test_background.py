"""Background work: tracked tasks, worker threads that give way to the event loop, daemon loads."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from router.background import WORKER_NICENESS, Background, on_daemon_thread, worker_pool


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


async def test_a_daemon_load_returns_its_value_and_raises_its_error() -> None:
    def where(x: int) -> tuple[int, str, bool]:
        me = threading.current_thread()
        return x + 1, me.name, me.daemon

    # A daemon thread: the exit does not wait for it (a pool's or asyncio.to_thread's would be joined).
    assert await on_daemon_thread(where, 41, name="load-x") == (42, "load-x", True)

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await on_daemon_thread(boom, name="load-boom")


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
async def test_a_nice_daemon_load_runs_at_a_workers_priority() -> None:
    assert await on_daemon_thread(_niceness, name="load-nice", nice=True) == min(
        19, _niceness() + WORKER_NICENESS
    )
    assert await on_daemon_thread(_niceness, name="load-plain") == _niceness()


async def test_a_cancelled_daemon_load_leaves_its_thread_to_finish() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    release = threading.Event()
    task = asyncio.ensure_future(on_daemon_thread(release.wait, 10, name="load-slow"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (thread,) = [t for t in threading.enumerate() if t.name == "load-slow"]
    release.set()
    await asyncio.to_thread(thread.join, 10)
    await asyncio.sleep(0)  # its late result, already queued on the loop, goes nowhere
    assert not thread.is_alive() and errors == []
