"""``router tasks``: the task ledger, read from the log (``router.telemetry.ledger`` builds and prints it)."""

from __future__ import annotations

import argparse

from router.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from router.telemetry.ledger import run_tasks

    if args.task_id is not None:  # `router tasks ID`, as `router outcome ID` takes it
        if args.task is not None and args.task != args.task_id:
            raise ConfigError(f"two task ids: {args.task_id!r} and --task {args.task!r}; give one")
        args.task = args.task_id
    return run_tasks(args)
