"""Per-arm outcomes from the log: tasks, success rate, cost per completed task, latency.

A task belongs to the arm of its first logged request (the arm is a function of the task id, so
all its requests agree unless the control share changed mid-task). A task's verdict is the one
``router tasks`` shows, by the same rule (``router.telemetry.ledger.verdicts_in``): an explicit
outcome first, else the latest inferred label (an inferred label only where a backend answered
the attempt's latest request, ``credible``), else a failure for a task whose latest main-loop
request no backend answered (the router refused it, or every backend failed; its spend counts in
cost per completed task). An explicit verdict counts 1 or 0; a label of the label model counts
its calibrated P(success) (its confidence), so an unsure label moves a rate less; a label of the
older hand-weighted signals counts 1 or 0. Tasks without a verdict count in ``tasks`` but not in
the rates, save a task of side calls alone, which awaits none (``ledger.side_only``: an opencode
session's title) and counts in neither.

Intervals are 95%: Wilson's for the success rate; for cost per completed task (a ratio of two
means over tasks, total cost / completed) the delta method.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from router.features.labels.model import SOURCE as LABEL_MODEL
from router.store import OutcomeRecord, RequestRecord
from router.telemetry.ledger import latest_main, verdicts_in
from router.telemetry.report import quantile

Z95 = 1.959964


@dataclass(slots=True)
class ArmTasks:
    """One arm's tasks that have a verdict: success (0/1) and cost of each, in the same order."""

    tasks: int = 0
    success: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    #: The virtual key that made each task (None: the master key or open mode), in the same order.
    keys: list[str | None] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.success)


class TaskTally:
    """Each task's arm and cost, accumulated from log rows of one revision (or of any, with None)
    that arrived at ``since`` or later (a revision applied again is a new trial: the rows of its
    earlier time in force carry the same revision).

    Rows may be added in several batches that overlap: a request id counts once. ``latency``
    keeps every successful request's end-to-end time (for reports; the guard does without)."""

    def __init__(
        self, revision: str | None = None, *, since: float | None = None, latency: bool = True
    ) -> None:
        self.revision = revision
        self.since = since
        self.arm_of: dict[str, str] = {}
        self.key_of: dict[str, str | None] = {}
        self.cost: dict[str, float] = defaultdict(float)
        self.latency: dict[str, list[float]] | None = defaultdict(list) if latency else None
        #: Request ids counted, with their arrival time (``forget_before`` prunes them).
        self.seen: dict[str, float] = {}
        #: Per (task, attempt), its latest main-loop request's start and whether a backend
        #: answered it: only an attempt so answered has an inferred verdict.
        self.latest: dict[tuple[str, int], tuple[float, bool]] = {}
        #: Tasks with a main-loop request: one of side calls alone is no task (``ledger.side_only``).
        self.main: set[str] = set()

    def add(self, requests: Iterable[RequestRecord]) -> None:
        for r in requests:
            task, arm, rid = r.task_id, r.arm, r.request_id
            if (
                not task
                or not arm
                or (self.revision is not None and r.policy_revision != self.revision)
                or (self.since is not None and r.ts < self.since)
                or rid in self.seen
            ):
                continue
            self.seen[rid] = r.ts
            self.arm_of.setdefault(task, arm)
            self.key_of.setdefault(task, r.key_id)
            self.cost[task] += r.cost_usd or 0.0
            if not r.side_call:
                self.main.add(task)
            latest_main((r,), self.latest)
            if self.latency is not None and r.status == 200 and r.total_ms is not None:
                self.latency[self.arm_of[task]].append(r.total_ms)

    def forget_before(self, ts: float) -> None:
        """Stop remembering request ids that arrived before ``ts`` (no batch will hold them again)."""
        self.seen = {rid: t for rid, t in self.seen.items() if t >= ts}

    def verdicts(self, outcomes: Iterable[OutcomeRecord]) -> dict[str, OutcomeRecord]:
        """The verdict of each task tallied that has one (``ledger.verdicts_in``)."""
        return verdicts_in(self.latest, (o for o in outcomes if o.task_id in self.arm_of))

    def arms(self, outcomes: Iterable[OutcomeRecord]) -> dict[str, ArmTasks]:
        verdicts = self.verdicts(outcomes)
        arms: dict[str, ArmTasks] = defaultdict(ArmTasks)
        for task, arm in self.arm_of.items():
            v = verdicts.get(task)
            if v is None and task not in self.main:
                continue
            a = arms[arm]
            a.tasks += 1
            if v is not None:
                a.success.append(success_value(v))
                a.cost.append(self.cost[task])
                a.keys.append(self.key_of.get(task))
        for arm, values in (self.latency or {}).items():
            arms[arm].latency_ms = sorted(values)
        return dict(arms)


def success_value(o: OutcomeRecord) -> float:
    """How much a task's verdict counts as a completion (see the module's docstring)."""
    if not o.explicit and o.source == LABEL_MODEL and o.score is not None:
        return min(1.0, max(0.0, o.score))
    return 1.0 if o.success else 0.0


def by_arm(
    requests: Iterable[RequestRecord], outcomes: Iterable[OutcomeRecord], revision: str | None = None
) -> dict[str, ArmTasks]:
    """Tasks per arm (requests without an arm are left out; ``revision``: only that revision's)."""
    tally = TaskTally(revision)
    tally.add(requests)
    return tally.arms(outcomes)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    if n == 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def ratio_of_means(num: Sequence[float], den: Sequence[float]) -> tuple[float, float] | None:
    """``sum(num) / sum(den)`` and the delta method's variance of it (None when sum(den) is 0)."""
    n = len(num)
    mn, md = sum(num) / n if n else 0.0, sum(den) / n if n else 0.0
    if n < 2 or md <= 0:
        return None
    r = mn / md
    vn = sum((x - mn) ** 2 for x in num) / (n - 1)
    vd = sum((y - md) ** 2 for y in den) / (n - 1)
    cov = sum((x - mn) * (y - md) for x, y in zip(num, den, strict=True)) / (n - 1)
    return r, max(0.0, (vn - 2 * r * cov + r * r * vd) / (n * md * md))


def summary(a: ArmTasks) -> dict[str, Any]:
    completed = sum(a.success)
    ci = wilson(completed, a.n)
    cpc = ratio_of_means(a.cost, a.success)
    cpc_ci = None
    if cpc is not None:
        half = Z95 * math.sqrt(cpc[1])
        cpc_ci = [round(max(0.0, cpc[0] - half), 6), round(cpc[0] + half, 6)]
    return {
        "tasks": a.tasks,
        "with_outcome": a.n,
        "completed": round(completed, 3),
        "success_rate": round(completed / a.n, 6) if a.n else None,
        "success_ci95": [round(x, 6) for x in ci] if ci else None,
        "cost_per_completed_usd": round(cpc[0], 6) if cpc else None,
        "cost_per_completed_ci95": cpc_ci,
        "latency_ms": {
            "requests": len(a.latency_ms),
            "p50": quantile(a.latency_ms, 0.5),
            "p95": quantile(a.latency_ms, 0.95),
        },
    }


def arm_report(requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """``router report --by arm``: per policy revision, each arm's summary."""
    revisions = sorted({r.policy_revision for r in requests if r.arm}, key=str)
    out = []
    for rev in revisions:
        arms = by_arm(requests, outcomes, rev)
        out.append({"revision": rev, "arms": {k: summary(v) for k, v in sorted(arms.items())}})
    return {"by": "arm", "revisions": out}


def render(report: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from router.telemetry import tables

    console = Console(soft_wrap=True)
    if not report["revisions"]:
        console.print("no request in the window was assigned an arm (the policy has no control: section)")
    for rev in report["revisions"]:
        t = Table("arm", "tasks", "with outcome", "success (95% CI)", "$ per completed task (95% CI)",
                  "latency p50 / p95 ms", title=f"revision {rev['revision']}", title_justify="left")  # fmt: skip
        for arm, s in rev["arms"].items():
            succ = "n/a" if s["success_rate"] is None else (
                f"{s['success_rate']:.1%} ({s['success_ci95'][0]:.1%}-{s['success_ci95'][1]:.1%})")  # fmt: skip
            cpc = "n/a" if s["cost_per_completed_usd"] is None else (
                f"${s['cost_per_completed_usd']:.6f} (${s['cost_per_completed_ci95'][0]:.6f}-"
                f"${s['cost_per_completed_ci95'][1]:.6f})")  # fmt: skip
            lat = s["latency_ms"]
            lat_text = "n/a" if lat["p50"] is None else f"{lat['p50']:.0f} / {lat['p95']:.0f}"
            t.add_row(arm, str(s["tasks"]), str(s["with_outcome"]), succ, cpc, lat_text)
        tables.show(console, t)


def run_arm_report(args: Any) -> int:
    import asyncio

    import orjson

    from router.store.window import parse_duration, read_window

    window = asyncio.run(read_window(args.store, parse_duration(args.since)))
    report = {
        **arm_report(window.requests, window.outcomes),
        "since": window.since,
        "until": window.until,
    }
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        render(report)
    return 0
