"""`router demo --tasks N`: real SWE-bench tasks worked through the live router, as an agent would.

Each task opens with a shipped SWE-bench issue (``tasks.jsonl``) and goes on for several turns
whose messages are those of the shipped agent run on that issue (mini-swe-agent's system prompt,
the issue, then its THOUGHT + bash turns and their observations). When the task is over, its
outcome is the one the shipped data records for the real model the serving backend stands for
(``swe_outcomes.csv``), posted through ``POST /v1/outcomes`` as a CI job would. The log is then
the learning loop's input: explored and chosen attempts, each with a label.

The outcome data is CC BY-NC 4.0 (SWE-bench team, swebench.com): it ships with the checkout under
``evals/data`` with its licence notice, and is read from there, from ``--data DIR``, or from a
``shared/data`` folder beside the checkout — never bundled into the installed package.
"""

from __future__ import annotations

import asyncio
import gzip
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from router.errors import ConfigError
from router.learning.evals import loader
from router.store import mask_url
from router.telemetry import tables

CHECKOUT = Path(__file__).resolve().parents[2]
TRAJECTORIES = "gemini-3-pro-preview.jsonl.gz"
#: The real model each demo backend stands for: the one whose list prices it charges.
STANDS_FOR: Mapping[str, str] = {
    "local-nano": "gpt-5-nano-medium",
    "local-mini": "gpt-5-mini-medium",
    "local-large": "gpt-5-medium",
    "local-claude": "claude-sonnet-4-5",
}
#: Turns of one task at most: the shipped runs take a median of 36, and the demo has to be quick.
MAX_TURNS = 6


@dataclass(frozen=True)
class Source:
    """The shipped data the tasks are made of: issues, outcomes per (issue, model), and the agent
    run's messages per issue (its first ``MAX_TURNS`` turns)."""

    where: Path
    tasks: list[loader.Task]
    outcomes: Mapping[tuple[str, str], loader.Outcome]
    runs: Mapping[str, list[dict[str, str]]]


def data_dirs(given: Path | None) -> tuple[Path, Path]:
    """The outcome data's folder and the trajectories file: ``given`` (either layout), else the
    checkout's ``evals/data``, else ``shared/data`` beside the checkout."""
    if given is not None:
        candidates = [given]
    else:
        candidates = [CHECKOUT / "evals" / "data" / "swebench-verified", CHECKOUT.parent / "shared" / "data"]
    for d in candidates:
        for runs in (d / "trajectories" / TRAJECTORIES, d.parent / "trajectories" / TRAJECTORIES):
            if (d / loader.OUTCOMES).is_file() and runs.is_file():
                return d, runs
    looked = ", ".join(str(d) for d in candidates)
    raise ConfigError(
        f"--tasks needs the shipped SWE-bench data ({loader.TASKS}, {loader.OUTCOMES}, {loader.MODELS} and "
        f"trajectories/{TRAJECTORIES}), not found in {looked}: pass --data DIR (a checkout has it in "
        "evals/data/swebench-verified)"
    )


def load_source(given: Path | None) -> Source:
    where, runs_file = data_dirs(given)
    data = loader.load(where)
    missing = [m for m in STANDS_FOR.values() if m not in data.model_ids]
    if missing:
        raise ConfigError(f"{where / loader.OUTCOMES}: no outcomes for {', '.join(missing)}")
    runs: dict[str, list[dict[str, str]]] = {}
    with gzip.open(runs_file, "rb") as f:
        for line in f:
            run = orjson.loads(line)
            # system, the issue, then an assistant turn and its observation per turn after the first
            kept = run["messages"][: 2 + 2 * (MAX_TURNS - 1)]
            runs[run["instance_id"]] = [{"role": m["role"], "content": m["content"]} for m in kept]
    tasks = [t for t in data.tasks if len(runs.get(t.id, ())) >= 2]
    if not tasks:
        raise ConfigError(f"{runs_file}: no agent run for any task of {where / loader.TASKS}")
    return Source(where, tasks, data.outcomes, runs)


@dataclass
class TaskRun:
    task_id: str
    instance_id: str
    requests: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0
    #: The verdict posted, or None when none could be (no backend served, or one the data lacks).
    success: bool | None = None

    @property
    def backend(self) -> str | None:
        """The backend that served most of the task, as training attributes an attempt."""
        return self.served.most_common(1)[0][0] if self.served else None


@dataclass
class Progress:
    """How far a run got, for what a Ctrl-C says: the tasks begun, and those done (outcome posted)."""

    begun: int = 0
    done: list[TaskRun] = field(default_factory=list)

    def interrupted(self, n: int, store: str) -> str:
        labelled = sum(r.success is not None for r in self.done)
        left = self.begun - len(self.done)
        return (f"router demo: interrupted after {len(self.done)} of {n} tasks, {labelled} of them labelled, "
                f"in {mask_url(store)}"
                + (f"; the {left} in flight may have no outcome (then the router's guess, inferred, stands for one)"
                   if left else "")
                + ": `router train` learns from what is there, and `router demo --tasks N` adds new tasks")  # fmt: skip


async def run_tasks(
    base: str, headers: Mapping[str, str], source: Source, n: int, *, concurrency: int = 16,
    seed: int | None = None, progress: Progress | None = None,
) -> list[TaskRun]:  # fmt: skip
    """``n`` tasks against the router at ``base``, ``concurrency`` at a time; task ids are new on
    every run, so that runs never merge their tasks."""
    progress = progress or Progress()
    rng = random.Random(seed)
    picks = [rng.choice(source.tasks) for _ in range(n)]
    run_id = f"{time.time_ns() // 1_000_000:x}"[-8:]
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers=dict(headers), timeout=60, limits=limits) as client:

        async def one(i: int, task: loader.Task) -> TaskRun:
            async with gate:
                progress.begun += 1
                run = await _work(
                    client, source, TaskRun(f"demo-{run_id}-{i:04d}-{task.id}", task.id), task.repo
                )
                progress.done.append(run)
                return run

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(picks))))


async def _work(client: httpx.AsyncClient, source: Source, run: TaskRun, repo: str) -> TaskRun:
    messages = source.runs[run.instance_id]
    headers = {"x-router-task-id": run.task_id, "x-router-repo": repo}
    turns = MAX_TURNS
    for turn in range(MAX_TURNS):
        if turn >= turns:
            break
        body = {"model": "auto", "messages": messages[: 2 + 2 * turn]}
        r = await client.post("/v1/chat/completions", content=orjson.dumps(body),
                              headers={**headers, "content-type": "application/json"})  # fmt: skip
        run.requests += 1
        if r.status_code != 200:
            run.errors[r.status_code] += 1
            break
        backend = r.headers.get("x-router-model", "")
        run.served[backend] += 1
        run.cost_usd += float(r.headers.get("x-router-cost-usd") or 0)
        if turn == 0:  # as many turns as the real model took, within the demo's limit and the run's
            took = source.outcomes.get((run.instance_id, STANDS_FOR.get(backend, "")))
            turns = min(took.calls if took else 1, (len(messages) - 2) // 2 + 1)
    stands_for = STANDS_FOR.get(run.backend or "")
    outcome = source.outcomes.get((run.instance_id, stands_for or ""))
    if outcome is not None:
        r = await client.post("/v1/outcomes", json={"task_id": run.task_id, "success": outcome.resolved,
                                                    "source": "demo: swe_outcomes.csv"})  # fmt: skip
        if r.status_code == 200:
            run.success = outcome.resolved
        else:
            run.errors[r.status_code] += 1
    return run


def summary_rows(runs: list[TaskRun]) -> list[dict[str, Any]]:
    """Per backend that served tasks: tasks, labelled, completed, spend, $ per completed task."""
    rows: dict[str, dict[str, Any]] = {}
    for r in runs:
        row = rows.setdefault(r.backend or "-", {"backend": r.backend or "-", "tasks": 0, "labelled": 0,
                                                 "completed": 0, "spend_usd": 0.0})  # fmt: skip
        row["tasks"] += 1
        row["labelled"] += r.success is not None
        row["completed"] += bool(r.success)
        row["spend_usd"] += r.cost_usd
    for row in rows.values():
        row["per_completed_usd"] = row["spend_usd"] / row["completed"] if row["completed"] else None
    return sorted(rows.values(), key=lambda x: -x["tasks"])


def report(
    console: Console, runs: list[TaskRun], seconds: float, source: Source, store: str, policy: Path
) -> None:
    """What the run did, per backend, and the commands that take the loop on from here."""
    requests = sum(r.requests for r in runs)
    errors = sum(sum(r.errors.values()) for r in runs)
    labelled = sum(r.success is not None for r in runs)
    console.print(
        f"{len(runs)} tasks ({requests} requests, {errors} errors) in {seconds:.1f} s: SWE-bench issues from "
        f"{_shown(source.where)}, each task's verdict that of the real model its backend stands for, "
        f"posted to POST /v1/outcomes ({labelled} labelled)", highlight=False,
    )  # fmt: skip
    table = Table(title="Tasks by the backend that served them")
    for col in ("backend", "stands for", "tasks", "completed", "success", "spend", "$ per completed task"):
        table.add_column(col, no_wrap=True)
    for row in summary_rows(runs):
        rate = f"{row['completed'] / row['labelled']:.0%}" if row["labelled"] else "-"
        per = f"${row['per_completed_usd']:.6f}" if row["per_completed_usd"] is not None else "-"
        table.add_row(row["backend"], STANDS_FOR.get(row["backend"], "-"), str(row["tasks"]),
                      str(row["completed"]), rate, f"${row['spend_usd']:.6f}", per)  # fmt: skip
    tables.show(console, table)
    for row in summary_rows(runs):
        if row["backend"] not in STANDS_FOR and row["backend"] != "-":
            # A model added to the demo's policy file: its tasks were routed, not labelled.
            console.print(
                f"{row['backend']} stands for no model of the shipped data: its {row['tasks']} tasks have no "
                "outcome, so `router train` has no labelled attempt of it (the demo's backends: "
                f"{', '.join(STANDS_FOR)})", highlight=False, soft_wrap=True,
            )  # fmt: skip
    config, where = _shown(policy), "" if store == "sqlite:///router.db" else f" --store {store}"
    candidate = _shown(policy.with_suffix(".candidate.yaml"))  # the copy `router train` suggests
    console.print(
        "Next, the learning loop on this log (README, steps 5-8):\n"
        f"  router tasks --recent{where}\n"
        f"  router train --config {config} --out policies/learned/demo.json{where}\n"
        f"  cp {config} {candidate}\n"
        f"  router promote policies/learned/demo.json --config {candidate}\n"
        f"  router preview --config {candidate}{where}\n"
        f"  router demo --serve{where}      # the dashboard: spend, success, $ per completed task",
        highlight=False,
        soft_wrap=True,  # a command broken at 80 columns no longer pastes as one
    )


def _shown(path: Path) -> str:
    """A path as the user would type it from here: relative when under the working directory."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
