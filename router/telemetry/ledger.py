"""The task ledger: what each agent task cost, in requests, tokens and dollars, and how it ended.

A task is many requests (``task_id``), possibly over several attempts. Its cost is split into
input (uncached), output, cache read, cache write and hosted tools' calls at the prices in force
when each request ran (the split is stored per request; rows logged before it existed count as ``unsplit``). The
verdict on a task is an explicit outcome if there is one, else the latest inferred signal of an
attempt whose latest request a backend answered (``credible``), else, for a task whose latest
main-loop request no backend answered, a failure: "unanswered" (``ended_unanswered``); a request
refused before it was part of any attempt (no decision: an unknown model, a malformed body) ends none.

Cost per completed task is the spend on every task that has a verdict, divided by the tasks
that succeeded: failed tasks, those the router refused or no backend answered included, are part
of what a success costs. Tasks with no verdict yet are left out of it, and counted.

A "task" of side calls alone (``side_only``: opencode titles each session with a call of its own
prompt, which hashes to a task of its own) awaits no verdict: none will come, as no label is read
of a side call. It is listed, and its spend is summed, but it is not counted as a task.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from router.errors import ConfigError
from router.features.labels.model import SOURCE as LABEL_MODEL
from router.store import OutcomeRecord, RequestRecord, Store, mask_url
from router.telemetry import tries

TOKENS: dict[str, Callable[[RequestRecord], int | None]] = {
    "input": lambda r: r.input_tokens,
    "output": lambda r: r.output_tokens,
    "cache_read": lambda r: r.cache_read_tokens,
    "cache_write": lambda r: r.cache_write_tokens,
    "reasoning": lambda r: r.reasoning_tokens,
}
COSTS: dict[str, Callable[[RequestRecord], float | None]] = {
    "input": lambda r: r.cost_input_usd,
    "output": lambda r: r.cost_output_usd,
    "cache_read": lambda r: r.cost_cache_read_usd,
    "cache_write": lambda r: r.cost_cache_write_usd,
    "tools": lambda r: r.cost_tools_usd,
}


def _usd(x: float) -> float:
    return round(x, 10)


def _ok(r: RequestRecord) -> bool:
    return r.status == 200 and not r.error_type


def latest_main(
    requests: Iterable[RequestRecord], into: dict[tuple[str, int], tuple[float, bool]] | None = None
) -> dict[tuple[str, int], tuple[float, bool]]:
    """Per (task, attempt), when its latest main-loop request started and whether a backend
    answered it successfully (``into``: a mapping to add these requests to, as a log is read)."""
    out = {} if into is None else into
    for r in requests:
        # One refused before it was part of an attempt (an unknown model, a malformed body: no
        # decision) is none of the task's: a fresh demo's dashboard read "0.0% success (0 of 1)",
        # its only verdict the failure of the unknown-model example it sends to show a 404.
        if r.task_id and not r.side_call and (r.attempt is not None or _ok(r)):
            key = (r.task_id, r.attempt or 0)
            seen = out.get(key)
            if seen is None or r.ts >= seen[0]:
                out[key] = (r.ts, _ok(r))
    return out


def answered(requests: Iterable[RequestRecord]) -> set[tuple[str, int]]:
    """(task, attempt) of every attempt whose latest main-loop request a backend answered
    successfully (``latest_main``)."""
    return answered_in(latest_main(requests))


def answered_in(latest: Mapping[tuple[str, int], tuple[float, bool]]) -> set[tuple[str, int]]:
    """``answered`` from ``latest_main``'s mapping."""
    return {key for key, (_, ok) in latest.items() if ok}


def ended_answered(requests: Iterable[RequestRecord]) -> bool:
    """Whether a backend answered the latest of these main-loop requests (False with none)."""
    main = [r for r in requests if not r.side_call]
    return bool(main) and _ok(max(main, key=lambda r: r.ts))


#: The verdict's source of a task that ended on a request no backend answered (``ended_unanswered``).
UNANSWERED = "unanswered"


def ended_unanswered(latest: Mapping[tuple[str, int], tuple[float, bool]]) -> dict[str, OutcomeRecord]:
    """A failure per task whose latest main-loop request (``latest_main``'s mapping) no backend
    answered: the router refused it (a budget's 403, a stopped attempt's 400, a 429) or every
    backend failed. The task did not complete, and what it spent before is part of what completed
    tasks cost: left without a verdict (an inferred label does not count there, ``credible``), its
    spend was left out of cost per completed task. A later request of the task that a backend
    answers (a 429 waited out, a new attempt) ends this; the log keeps no outcome of it, it is
    read from the requests."""
    return {
        task: OutcomeRecord(task, attempt, False, None, UNANSWERED, None, ts, False)
        for task, (attempt, ts) in unanswered_in(latest).items()
    }


def unanswered_in(latest: Mapping[tuple[str, int], tuple[float, bool]]) -> dict[str, tuple[int, float]]:
    """``ended_unanswered`` from ``latest_main``'s mapping: per such task, the attempt and the
    start of its latest main-loop request."""
    ends: dict[str, tuple[float, int, bool]] = {}
    for (task, attempt), (ts, ok) in latest.items():
        if (seen := ends.get(task)) is None or ts >= seen[0]:
            ends[task] = (ts, attempt, ok)
    return {task: (attempt, ts) for task, (ts, attempt, ok) in ends.items() if not ok}


def task_verdicts(
    requests: Sequence[RequestRecord], outcomes: Iterable[OutcomeRecord]
) -> dict[str, OutcomeRecord]:
    """Per task of ``requests`` with one, the verdict that counts: its ``credible`` outcomes'
    ``verdict``, else ``ended_unanswered``'s failure."""
    return verdicts_in(latest_main(requests), outcomes)


def verdicts_in(
    latest: Mapping[tuple[str, int], tuple[float, bool]], outcomes: Iterable[OutcomeRecord]
) -> dict[str, OutcomeRecord]:
    """``task_verdicts`` from ``latest_main``'s mapping, for a log read in batches (the rollout
    arms' tally): one rule, so the arms and ``router tasks`` cannot judge a task apart."""
    by_task: dict[str, list[OutcomeRecord]] = defaultdict(list)
    for o in credible(outcomes, answered_in(latest)):
        by_task[o.task_id].append(o)
    found = {t: v for t, os in by_task.items() if (v := verdict(os)) is not None}
    return ended_unanswered(latest) | found


def credible(outcomes: Iterable[OutcomeRecord], replied: set[tuple[str, int]]) -> list[OutcomeRecord]:
    """The outcomes a verdict may rest on: every explicit one, and a label inferred from the
    conversation only for an attempt whose latest main-loop request a backend answered
    (``answered``).

    An inferred label reads what the agent did with the replies. With none (every request
    refused, or failed by every backend) there was nothing to read: the label model called a task
    of five "hi there" requests, each a 404, a success at P=0.9997. An attempt that ended on a
    request the router refused (a budget's 403, a stopped attempt's 400, a 429) or no backend
    answered did not end by the agent's doing: the label read before it was "done" for a task
    the budget stopped. Such an attempt has no inferred verdict (nor an inferred training label:
    ``router.learning.training.dataset`` calls it abandoned, a failure, once idle); what the
    client says explicitly still counts. An attempt of 0 is unknown: an outcome without one
    needs an answered request in any attempt of its task, a request without one answers every
    attempt of its task."""
    tasks = {task for task, _ in replied}
    out = []
    for o in outcomes:
        task, attempt = o.task_id, o.attempt or 0
        if (
            o.explicit
            or (task, attempt) in replied
            or (task, 0) in replied
            or (not attempt and task in tasks)
        ):
            out.append(o)
    return out


def verdict(outcomes: Iterable[OutcomeRecord]) -> OutcomeRecord | None:
    """The verdict that counts: an explicit one before any inferred signal (as in training), then
    the latest attempt's, then the latest recorded."""
    return max(outcomes, default=None, key=lambda o: (o.explicit, o.attempt or 0, o.ts))


def final_outcome(outcomes: Iterable[OutcomeRecord]) -> dict[str, Any] | None:
    """``verdict`` as the ledger shows it."""
    best = verdict(outcomes)
    if best is None:
        return None
    return {
        "success": best.success,
        "score": best.score,
        "source": best.source,
        "explicit": best.explicit,
        "attempt": best.attempt,
        "ts": best.ts,
    }


def said_by(outcome: Mapping[str, Any]) -> str:
    """Whose verdict it is, shown beside it: the client's ("explicit"), "unanswered", or the
    router's own guess with how sure it is. "done (outcome_model)" said neither that it was a guess
    nor that `router outcome` overrides it, and on the demo's fake provider, whose replies do
    nothing, the guess is a success at P 0.98 for a Claude Code session."""
    source = str(outcome.get("source") or "unknown")
    if outcome.get("explicit") or source == UNANSWERED:
        return source
    score = outcome.get("score")
    p = f", P(success) {score:.2f}" if isinstance(score, int | float) and not isinstance(score, bool) else ""
    return f"inferred{p}" if source == LABEL_MODEL else f"inferred from {source}{p}"


def side_only(requests: Iterable[RequestRecord], verdicts: Mapping[str, object]) -> set[str]:
    """The tasks of ``requests`` made of side calls alone and without a verdict (``verdicts``: by
    task): not tasks of their own, so counted in no task count (their spend still is)."""
    side: set[str] = set()
    main: set[str] = set()
    for r in requests:
        if r.task_id:
            (side if r.side_call else main).add(r.task_id)
    return {t for t in side - main if verdicts.get(t) is None}


def _costs(requests: Sequence[RequestRecord]) -> dict[str, float]:
    out = {"total": _usd(sum(r.cost_usd or 0.0 for r in requests))}
    for part, cost in COSTS.items():
        out[part] = _usd(sum(cost(r) or 0.0 for r in requests))
    out["unsplit"] = _usd(sum(r.cost_usd or 0.0 for r in requests if r.cost_input_usd is None))
    return out


def _end(r: RequestRecord) -> float:
    return r.ts + (r.total_ms or 0.0) / 1000


def task_ledger(
    task_id: str, requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord]
) -> dict[str, Any]:
    """One task's ledger from its log rows (requests oldest first)."""
    judged = task_verdicts(requests, outcomes).get(task_id)
    outcomes = credible(outcomes, answered(requests))
    by_attempt: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        by_attempt[r.attempt or 0].append(r)  # the outcomes table stores "unknown" as 0 too
    outcomes_by_attempt: dict[int, list[OutcomeRecord]] = defaultdict(list)
    for o in outcomes:
        outcomes_by_attempt[o.attempt or 0].append(o)
    backends: dict[str, dict[str, Any]] = {}
    for r in requests:
        b = backends.setdefault(r.chosen_model or "none", {"requests": 0, "cost_usd": 0.0})
        b["requests"] += 1
        b["cost_usd"] = _usd(b["cost_usd"] + (r.cost_usd or 0.0))
    side = [r for r in requests if r.side_call]
    outcome = final_outcome([] if judged is None else [judged])
    alone = bool(side_only(requests, {task_id: judged}))
    return {
        "task_id": task_id,
        "first_ts": requests[0].ts if requests else None,
        "last_end_ts": max(map(_end, requests)) if requests else None,
        "duration_s": round(max(map(_end, requests)) - requests[0].ts, 3) if requests else None,
        "requests": len(requests),
        "errors": sum(1 for r in requests if (r.status or 0) >= 400 or r.error_type),
        "fallbacks": sum(1 for r in requests if tries.fallen_back_from(r.tries)),
        "retries": sum(len(tries.retried(r.tries)) for r in requests),
        "side_calls": {"requests": len(side), "cost_usd": _usd(sum(r.cost_usd or 0.0 for r in side))},
        "side_only": alone,
        "attempts": [
            {
                "attempt": a,
                "requests": len(rows),
                "cost_usd": _usd(sum(r.cost_usd or 0.0 for r in rows)),
                "backends": dict(Counter(r.chosen_model or "none" for r in rows)),
                "outcome": final_outcome(outcomes_by_attempt.get(a, [])),
            }
            for a, rows in sorted(by_attempt.items())
        ],
        "backends": backends,
        "tokens": {k: sum(count(r) or 0 for r in requests) for k, count in TOKENS.items()},
        "cost_usd": _costs(requests),
        "outcome": outcome,
        "completed": None if outcome is None else outcome["success"],
    }


def task_ledgers(
    requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord]
) -> list[dict[str, Any]]:
    """Ledgers of every task with requests in ``requests``, the most recently active first."""
    rows: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if r.task_id:
            rows[r.task_id].append(r)
    verdicts: dict[str, list[OutcomeRecord]] = defaultdict(list)
    for o in outcomes:
        verdicts[o.task_id].append(o)
    ledgers = [task_ledger(t, sorted(rs, key=lambda r: r.ts), verdicts.get(t, [])) for t, rs in rows.items()]
    return sorted(ledgers, key=lambda x: x["last_end_ts"] or 0, reverse=True)


def summary(ledgers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Across tasks: how many ended how, and the cost per completed task. Tasks of side calls alone
    (``side_only``) are counted apart, in ``side_only``; their spend is in ``cost_usd``."""
    judged = [x for x in ledgers if x["completed"] is not None]
    completed = sum(1 for x in judged if x["completed"])
    judged_cost = _usd(sum(x["cost_usd"]["total"] for x in judged))
    alone = [x for x in ledgers if x["side_only"]]
    tasks = len(ledgers) - len(alone)
    return {
        "tasks": tasks,
        "with_outcome": len(judged),
        "completed": completed,
        "failed": len(judged) - completed,
        "without_outcome": tasks - len(judged),
        "side_only": {"tasks": len(alone), "cost_usd": _usd(sum(x["cost_usd"]["total"] for x in alone))},
        "cost_usd": _usd(sum(x["cost_usd"]["total"] for x in ledgers)),
        "cost_of_judged_tasks_usd": judged_cost,
        "cost_per_completed_task_usd": _usd(judged_cost / completed) if completed else None,
    }


async def load_task(store: Store, task_id: str, limit: int | None = None) -> dict[str, Any] | None:
    """One task's ledger, or None when the log has no request of it. With ``limit``, of its latest
    ``limit`` requests only (``capped`` says so), added up on a worker thread: what a server reads
    for one look at a task, which must not hold the event loop however long the task."""
    requests = await store.requests_for_task(task_id, None if limit is None else limit + 1)
    if not requests:
        return None
    outcomes = await store.outcomes_for_task(task_id)
    if limit is None:
        return task_ledger(task_id, requests, outcomes)
    capped = len(requests) > limit
    ledger = await asyncio.to_thread(task_ledger, task_id, requests[-limit:], outcomes)
    ledger["capped"] = limit if capped else None
    return ledger


# ---- `router tasks`


def run_tasks(args: argparse.Namespace) -> int:
    import orjson

    from router.store.window import parse_duration, read_window

    window = asyncio.run(read_window(args.store, parse_duration(args.since)))
    ledgers = task_ledgers(window.requests, window.outcomes)
    if args.task:
        ledgers = [x for x in ledgers if x["task_id"] == args.task]
        if not ledgers:  # not an empty table and success: said like `router outcome` says it
            raise ConfigError(
                f"no task {args.task!r} in {mask_url(args.store)} in the last {args.since} "
                "(`router tasks --recent` lists ids; --since widens the window)"
            )
    if getattr(args, "recent", None):
        ledgers = ledgers[: args.recent]
    result = {"since": window.since, "until": window.until, "summary": summary(ledgers), "tasks": ledgers}
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    elif getattr(args, "recent", None):
        render_recent(ledgers)
    else:
        render(result)
    return 0


def usd(x: float) -> str:
    """Dollars with the digits that matter (four): agent calls often cost fractions of a cent,
    which read as dollars, not as "7.2e-06" beside the dashboard's 0.0000072."""
    if x == 0:
        return "0"
    places = max(0, 3 - math.floor(math.log10(abs(x))))
    text = f"{x:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def tokens(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


def render_recent(ledgers: Sequence[Mapping[str, Any]]) -> None:
    """One plain line per task, the full id first: nothing to truncate, easy to copy or cut."""
    if not ledgers:
        print("no task in this window (try --since 7d)")
    for x in ledgers:
        o = x["outcome"]
        verdict = (
            "side calls only" if x["side_only"] else
            "no verdict" if o is None else f"{'success' if o['success'] else 'failure'} ({said_by(o)})"
        )  # fmt: skip
        last = time.strftime("%Y-%m-%d %H:%M", time.localtime(x["last_end_ts"] or 0))
        n = x["requests"]
        print(
            f"{x['task_id']}  {last}  {n} request{'s' * (n != 1)}  ${usd(x['cost_usd']['total'])}  {verdict}"
        )


def render(result: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from router.telemetry import tables

    console = Console(soft_wrap=True)  # long lines stay whole, for a pager or grep
    table = Table(title="Tasks (most recent first)", title_justify="left")
    for col in ("task", "attempts", "requests (side)", "backends", "in/cached/out tokens", "cost $",
                "in/out/cache r/w $", "outcome", "time"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("task", "backends", "outcome") else "right")
    for x in result["tasks"]:
        t, c, o = x["tokens"], x["cost_usd"], x["outcome"]
        verdict = (
            "— (side calls only)" if x["side_only"] else
            "—" if o is None else f"{'done' if o['success'] else 'failed'} ({said_by(o)})"
        )  # fmt: skip
        table.add_row(
            x["task_id"], str(len(x["attempts"])), f"{x['requests']} ({x['side_calls']['requests']})",
            ", ".join(f"{b} x{v['requests']}" for b, v in x["backends"].items()),
            "/".join(tokens(t[k]) for k in ("input", "cache_read", "output")), usd(c["total"]),
            "/".join(usd(c[k]) for k in ("input", "output", "cache_read", "cache_write")),
            verdict, f"{x['duration_s'] or 0:.1f}s",
        )  # fmt: skip
    tables.show(console, table)
    s = result["summary"]
    per_task = s["cost_per_completed_task_usd"]
    console.print(
        f"{s['tasks']} task{'s' * (s['tasks'] != 1)}: {s['completed']} completed, {s['failed']} failed, {s['without_outcome']} without "
        f"an outcome{side_only_text(s)}; spent ${usd(s['cost_usd'])}; cost per completed task: "
        + (f"${usd(per_task)}" if per_task is not None else "n/a (no completed task with an outcome)")
    )


def side_only_text(s: Mapping[str, Any]) -> str:
    """The summary's tasks of side calls alone, said after the task counts ("" when none)."""
    n = s["side_only"]["tasks"]
    if not n:
        return ""
    return f" (and {n} of side calls alone, such as a session's title: no verdict awaited)"
