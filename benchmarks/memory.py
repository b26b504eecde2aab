"""``python -m benchmarks.memory``: does a replica's memory level off while tasks keep coming?

``make bench`` reads the router's resident memory at start and after its cells, over a few dozen
tasks. This drives the worst case for what a replica remembers: every request starts a new task
(a new conversation whose first user message is a real issue from ``evals/data``, so each task's
features are as large as live ones), until the per-task memory (``ROUTER_MAX_TASKS``, 100,000 by
default) has been filled and recycled. Prints the resident memory after each round; it must level
off once the bounds are reached. Starts the fake upstream and the router as the load benchmark
does, and stops them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import bodies, replay, scenarios
from benchmarks.loadgen import Call, run_count
from benchmarks.procs import Services, choose_pinning, rss_bytes
from benchmarks.report import ROUTER
from benchmarks.run import ROOT, _run, entry, handle_interrupts, start

ISSUES = ROOT / "evals" / "data" / "swebench-verified" / "tasks.jsonl"
#: Distinct issue texts the tasks cycle through (each task is still new: its number differs).
N_ISSUES = 64
CONCURRENCY = 16


def issue_calls(n: int) -> list[Call]:
    """One chat call per issue: a four-message turn whose task is the issue, each request a new task."""
    with ISSUES.open() as f:
        texts = [json.loads(line)["problem_statement"] for line, _ in zip(f, range(n), strict=False)]
    base = scenarios.call(scenarios.SCENARIOS["chat"], ROUTER)
    calls = []
    for text in texts:
        body = bodies.chat_body("auto", stream=False)
        body["messages"][1]["content"] = f"Task {bodies.TASK}:\n{text}"
        calls.append(dataclasses.replace(base, body=bodies.template(body), tasks=2**62))
    return calls


def conversation_calls(n: int) -> list[Call]:
    """``n`` real agent runs in flight at once, interleaved turn by turn (``benchmarks.replay``)."""
    base = scenarios.call(scenarios.SCENARIOS["replay"], ROUTER)
    assert isinstance(base.body, replay.Replay)
    return [dataclasses.replace(base, body=dataclasses.replace(base.body, slots=n))]


async def drive(
    url: str, pid: int, rounds: int, per_round: int, calls: list[Call], concurrency: int = 1
) -> list[tuple[int, float, float]]:
    """(requests so far, RSS MiB, seconds) after each round; each call is sent by its own workers."""
    counter = itertools.count()  # request numbers, and so task numbers: never repeated
    out = [(0, rss_bytes(pid) / 2**20, 0.0)]
    sent = 0
    for _ in range(rounds):
        started = time.perf_counter()
        share = max(1, per_round // len(calls))
        failed = sum(await asyncio.gather(*(run_count(url, c, concurrency, share, counter) for c in calls)))
        if failed:
            raise SystemExit(f"{failed} requests failed")
        sent += share * len(calls)
        out.append((sent, rss_bytes(pid) / 2**20, time.perf_counter() - started))
        print(f"  {sent:>9,} requests: {out[-1][1]:,.0f} MiB", file=sys.stderr, flush=True)
    return out


def render(points: list[tuple[int, float, float]], title: str) -> str:
    lines = [
        title,
        "| requests | RSS MiB | change MiB | round s |",
        "|---------:|--------:|-----------:|--------:|",
    ]
    prev = None
    for sent, mib, secs in points:
        change = "–" if prev is None else f"{mib - prev:+,.0f}"
        lines.append(f"| {sent:>8,} | {mib:>7,.0f} | {change:>10} | {secs:>7.1f} |")
        prev = mib
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rounds", type=int, default=8, help="rounds of requests (default 8)")
    p.add_argument("--per-round", type=int, default=25_600, help="new tasks per round (default 25,600)")
    p.add_argument("--max-tasks", type=int, default=100_000, help="the router's ROUTER_MAX_TASKS")
    p.add_argument(
        "--conversations", type=int,
        help="instead of a new task per request: this many real agent runs in flight at once, replayed "
        "turn by turn (16 workers); shows what the conversation memo's bound holds",
    )  # fmt: skip
    args = p.parse_args(argv)
    handle_interrupts()
    pin = choose_pinning(True)
    if pin.driver is not None:
        os.sched_setaffinity(0, {pin.driver})
    workdir = Path(tempfile.mkdtemp(prefix="router-memory-"))
    try:
        with Services(workdir) as svc:
            settings = {"ROUTER_MAX_TASKS": str(args.max_tasks)}
            router = start(svc, pin, workdir, with_litellm=False, router_env=settings)[ROUTER]
            if args.conversations:
                calls, workers = conversation_calls(args.conversations), CONCURRENCY
                title = (f"Router RSS with {args.conversations:,} real agent conversations in flight "
                         f"(ROUTER_TRANSCRIPT_MEMORY_BYTES default, ROUTER_MAX_TASKS={args.max_tasks:,}):")  # fmt: skip
            else:
                calls, workers = issue_calls(N_ISSUES), 1
                title = ("Router RSS while every request starts a new task (real issue texts; "
                         f"ROUTER_MAX_TASKS={args.max_tasks:,}):")  # fmt: skip
            points = _run(drive(router.url, router.pid, args.rounds, args.per_round, calls, workers))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(points, title))
    return 0


if __name__ == "__main__":
    entry(main)
