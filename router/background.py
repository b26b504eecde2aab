"""A tracked group of fire-and-forget tasks: strong references, logged failures, a bounded drain."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class BackgroundTasks:
    """One per app. The event loop keeps only weak references to tasks, so an untracked task can
    be garbage-collected mid-flight; this set keeps them alive until they finish."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

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
