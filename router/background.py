"""Work beside the requests: a tracked group of fire-and-forget tasks (strong references, logged
failures, a bounded drain), the worker threads that run blocking work for the event loop, and
daemon threads for loads that the process may exit in the middle of."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Background:
    """One per app. The event loop keeps only weak references to tasks, so an untracked task can
    be garbage-collected mid-flight; this set keeps them alive until they finish."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._workers = worker_pool("router-worker")  # its threads start on first use
        # At the loop's own priority, unlike the pool: its work holds the GIL (pure Python, orjson),
        # and a thread held back by the scheduler while it holds the GIL holds the loop back too.
        self._large = ThreadPoolExecutor(1, thread_name_prefix="router-large")

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def spawn_blocking(self, fn: Callable[..., T], *args: Any, name: str) -> asyncio.Task[T]:
        """``fn(*args)`` on a worker thread (a lower-priority one: see ``worker_pool``), tracked."""
        return self.spawn(self.in_thread(fn, *args), name)

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread, awaited (by a task that is itself tracked)."""
        return await asyncio.get_running_loop().run_in_executor(self._workers, fn, *args)

    async def for_large(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` for one large request (its parse, its sizing), on a worker thread of its
        own, awaited: the event loop serves the other requests meanwhile. Large requests wait for
        each other there, never for the pool that the other requests' token counts need."""
        return await asyncio.get_running_loop().run_in_executor(self._large, fn, *args)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # also marks it retrieved: no "never retrieved" noise at exit
        if exc is not None:
            log.error("background task %r failed", task.get_name(), exc_info=exc)

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - what is left at the deadline is cancelled
        """Wait up to ``timeout`` s for every task, even ones spawned meanwhile; then cancel the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait(set(self._tasks), timeout=remaining)
        leftovers = set(self._tasks)
        if not leftovers:
            return
        log.warning(
            "cancelling %d background task(s) still running after %gs: %s",
            len(leftovers),
            timeout,
            sorted(t.get_name() for t in leftovers),
        )
        for task in leftovers:
            task.cancel()
        # A short grace lets their finally blocks run; a task that swallows cancellation is abandoned.
        await asyncio.wait(leftovers, timeout=1.0)


async def on_daemon_thread(fn: Callable[..., T], *args: Any, name: str, nice: bool = False) -> T:
    """``fn(*args)`` on a thread of its own that the process does not wait for at exit.

    For loads that only later requests need (litellm's import: seconds, tens under load; the
    tokenizer's encoding). On an executor's thread the exit would wait for them: ``asyncio.run``
    joins its default executor and the interpreter every pool's threads, so a start that failed
    to bind its port exited only once the import was done. Cancelling the await leaves the
    thread to finish or be dropped at exit; what it returns then goes nowhere. ``nice``: at a
    worker's lower priority (``worker_pool``).
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)

    def run() -> None:
        if nice:
            _lower_priority()
        result: Any = None
        exc: BaseException | None = None
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the awaiting task, which raises it
            exc = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


#: How much nicer than the event loop worker threads run (Linux nice steps; 10 gives a thread
#: about a tenth of a contended core, several times what the log writer needs at full load).
WORKER_NICENESS = 10


def worker_pool(name: str, max_workers: int | None = None) -> ThreadPoolExecutor:
    """Threads for blocking work beside the event loop (the SQLite log, token counts).

    They run at a lower OS priority than the loop, which answers the requests, so a shared core
    gives the loop most of its time. With equal priorities the log writer's batches showed as
    milliseconds added to the requests that arrived meanwhile (p99 of the wait for the backend's
    reply: 2.7-3.2 ms, against 1.6-2.0 ms). Niceness is a weight, not preemption: under Linux's
    EEVDF scheduler a waking loop can still wait out part of a worker's slice (in the agent-sized
    benchmark cells the loop waits 18-31 % of the time while a new tool output's tokens are counted).
    """
    return ThreadPoolExecutor(max_workers, thread_name_prefix=name, initializer=_lower_priority)


def _lower_priority() -> None:
    if sys.platform != "linux":  # elsewhere a thread's id does not name it for setpriority
        return
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WORKER_NICENESS))
