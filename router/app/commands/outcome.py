"""``router outcome``: the verdict on a task's attempt, written to the log as ``POST /v1/outcomes``
writes it (a running router's task memory does not hear of it)."""

from __future__ import annotations

import argparse
import asyncio
import time

from router.errors import ConfigError
from router.http.outcomes import EXPLICIT
from router.store import mask_url
from router.store.records import OutcomeRecord
from router.store.window import opened


def run(args: argparse.Namespace) -> int:
    attempt = asyncio.run(record_outcome(args.store, args.task_id, args.success, args.score, args.attempt))
    print(f"task {args.task_id} attempt {attempt}: {'success' if args.success else 'failure'} recorded")
    return 0


async def record_outcome(
    store_url: str, task_id: str, success: bool, score: float | None = None, attempt: int | None = None
) -> int:
    """Record the verdict; returns the attempt judged (the task's latest unless ``attempt``)."""
    if score is not None and not 0 <= score <= 1:
        raise ConfigError(f"--score: expected a number in [0, 1], got {score}")
    async with opened(store_url) as store:
        rows = await store.requests_for_task(task_id)
        if not rows:
            raise ConfigError(
                f"no request of task {task_id!r} is in {mask_url(store_url)} (`router tasks --recent` lists ids)"
            )
        latest = max(r.attempt or 1 for r in rows)
        if attempt is not None and not 1 <= attempt <= latest:
            raise ConfigError(
                f"--attempt {attempt}: task {task_id!r} has attempt 1"
                + (f" to {latest}" if latest > 1 else "")
                + " in the log"
            )
        judged = attempt or latest
        if not any(r.status == 200 and (r.attempt or 1) == judged for r in rows):
            # Nothing answered it (refused, failed, every backend down): there is no model to credit or blame.
            raise ConfigError(
                f"task {task_id!r} attempt {judged}: no backend served it (every request was refused or "
                "failed), so there is no verdict to record"
            )
        rec = OutcomeRecord(
            task_id=task_id, attempt=judged, success=success, score=score, source=EXPLICIT,
            details={"client_source": "cli"}, ts=time.time(), explicit=True,
        )  # fmt: skip
        await store.write_outcome(rec)
    return judged
