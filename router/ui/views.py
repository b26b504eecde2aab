"""What the dashboard's pages show, computed from log rows (pure: no I/O, no HTML).

The numbers come from the same functions as ``router report`` and ``router tasks``
(``router.telemetry.report`` and ``.ledger``), so the page and the CLI never disagree.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.features.labels.infer import LOOPING_P
from router.policy.decide import was_explored
from router.store import OutcomeRecord, RequestRecord
from router.store.records import TryRecord
from router.telemetry.ledger import final_outcome, said_by, summary, task_ledger, task_ledgers
from router.telemetry.report import GROUPS, PHASES, build_report, is_ok, phase_values, stats

#: The windows offered on every page, label → seconds.
WINDOWS: dict[str, float] = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
DEFAULT_WINDOW = "24h"
#: The groupings of "cost per completed task", in the order shown; a grouping appears once the
#: log has the column (policy revisions and arms are recorded only by policies that have them).
GROUPINGS = (("backend", "by backend"), ("revision", "by policy revision"), ("arm", "by arm"),
             ("route", "by route (requested model)"), ("key", "by key"))  # fmt: skip
PHASE_NAMES = {"queue_ms": "queue", "retry_ms": "retry", "ttft_ms": "TTFT", "decode_ms": "decode",
               "gap_mean_ms": "inter-token gap", "gap_max_ms": "worst gap", "upstream_other_ms": "upstream other",
               "delivery_ms": "delivery", "total_ms": "end to end"}  # fmt: skip
TIMELINE_BUCKETS = 24
TASKS_PER_PAGE = 100
#: Characters of an error's message shown beside its status and reason.
ERROR_MESSAGE_CHARS = 160
#: What the window's pages (not a task's) never show, so do not read: a logged prompt is the
#: log's largest column by far, the decision's candidates its largest JSON to decode.
UNREAD = frozenset({"prompt", "candidates", "task_features"})


def window_seconds(label: str | None, default: str = DEFAULT_WINDOW) -> tuple[str, float]:
    """A window label from the query string, or ``default`` when it is missing or unknown."""
    if label in WINDOWS:
        return label, WINDOWS[label]
    return default, WINDOWS[default]


def overview(
    requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord], since: float, until: float,
    key_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``key_names``: virtual keys' names by id, to show a key's spend under its name."""
    ledgers = task_ledgers(requests, outcomes)
    tasks = summary(ledgers)
    spend = sum(r.cost_usd or 0.0 for r in requests)
    groupings = []
    backends = build_report(requests, outcomes, by="backend")["groups"]
    for by, title in GROUPINGS:
        group_of = GROUPS.get(by)
        if group_of is None or not any(map(group_of, requests)):
            continue
        # The backend grouping is the one the page also shows on its own: built once.
        groups = backends if by == "backend" else build_report(requests, outcomes, by=by)["groups"]
        for g in groups:
            judged = g["tasks"]["with_outcome"]
            g["success_rate"] = g["tasks"]["completed"] / judged if judged else None
            g["label"] = _key_label(g["key"], key_names or {}) if by == "key" else g["key"]
        # The chart's labels have 150 px: a key by its name alone.
        chart = [((key_names or {}).get(g["key"], g["label"]) if by == "key" else g["label"],
                  g["cost_per_completed_task_usd"]) for g in groups]  # fmt: skip
        groupings.append({"by": by, "title": title, "groups": groups, "chart": chart})
    # What the headline leaves out: spend on tasks without a verdict, and on requests of no task.
    unlabelled = max(0.0, spend - tasks["cost_of_judged_tasks_usd"])
    return {
        "requests": len(requests),
        "errors": sum(1 for r in requests if not is_ok(r)),
        "error_kinds": errors(requests),
        "spend_usd": spend,
        "unlabelled_spend_usd": unlabelled,
        "unlabelled_share": unlabelled / spend if spend else None,
        "tokens": {
            "input_tokens": sum(r.input_tokens or 0 for r in requests),
            "output_tokens": sum(r.output_tokens or 0 for r in requests),
            "cache_read_tokens": sum(r.cache_read_tokens or 0 for r in requests),
        },
        "tasks": tasks,
        "success_rate": tasks["completed"] / tasks["with_outcome"] if tasks["with_outcome"] else None,
        "groupings": groupings,
        "share": [(g["key"], g["requests"]) for g in backends],
        "timeline": timeline(requests, since, until),
    }


def _key_label(key_id: str, names: Mapping[str, str]) -> str:
    if key_id == "(none)":
        return "(master or open)"
    return f"{names[key_id]} ({key_id})" if key_id in names else key_id


def errors(requests: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """The failed requests by status and reason (error type), most frequent first: how many, on
    which backends, when last, and the latest message."""
    kinds: dict[tuple[int, str], dict[str, Any]] = {}
    for r in requests:
        if is_ok(r):
            continue
        status = r.status or 0
        kind = kinds.setdefault((status, r.error_type or "-"), {
            "status": status, "reason": r.error_type or "-", "count": 0, "backends": Counter(),
            "last_ts": 0.0, "message": "",
        })  # fmt: skip
        kind["count"] += 1
        kind["backends"][r.chosen_model or "(none: refused before routing)"] += 1
        if r.ts >= kind["last_ts"]:
            kind["last_ts"] = r.ts
            message = r.error_message or ""
            cut = len(message) > ERROR_MESSAGE_CHARS
            kind["message"] = message[: ERROR_MESSAGE_CHARS - 1] + "…" if cut else message
    return sorted(kinds.values(), key=lambda k: (-k["count"], k["status"], k["reason"]))


def timeline(
    requests: Sequence[RequestRecord], since: float, until: float
) -> dict[str, list[tuple[str, float]]]:
    """Requests and spend per time bucket across the window (arrival time)."""
    width = (until - since) / TIMELINE_BUCKETS
    counts = [0.0] * TIMELINE_BUCKETS
    spend = [0.0] * TIMELINE_BUCKETS
    for r in requests:
        i = min(TIMELINE_BUCKETS - 1, max(0, int((r.ts - since) / width)))
        counts[i] += 1
        spend[i] += r.cost_usd or 0.0
    fmt = "%H:%M" if until - since <= 86400 else "%m-%d %H:%M"
    labels = [time.strftime(fmt, time.localtime(since + i * width)) for i in range(TIMELINE_BUCKETS)]
    labels[-1] = "now"  # the last bucket ends now; its start time would read as the window's end
    return {
        "requests": list(zip(labels, counts, strict=True)),
        "spend": list(zip(labels, spend, strict=True)),
    }


def latency(requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """Phase quantiles of successful requests, overall and per backend, with the load they ran under."""
    report = build_report(requests, outcomes, by="backend")
    ok = [r for r in requests if is_ok(r)]
    overall = {p: stats(phase_values(ok, p)) for p in PHASES}

    def bars(label: str, s: Mapping[str, Any]) -> tuple[str, float | None, float | None, float | None]:
        return (label, s["p50"], s["p95"], s["p99"])

    per_backend = {
        PHASE_NAMES[p]: [bars(g["key"], g["phases_ms"][p]) for g in report["groups"]]
        for p in ("ttft_ms", "total_ms")
    }
    return {
        "window": report["window"],
        "phases": [(p, PHASE_NAMES[p]) for p in PHASES],
        "overall": overall,
        "chart": [bars(PHASE_NAMES[p], overall[p]) for p in PHASES],
        "per_backend": per_backend,
        "groups": report["groups"],
    }


def task_rows(
    requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord], query: str = "", page: int = 1
) -> dict[str, Any]:
    """The task list, most recently active first, filtered by a case-insensitive substring of the
    task id, its repository, a backend, the client or the verdict; ``page``: which
    ``TASKS_PER_PAGE`` of them (from 1; past the last page, the last)."""
    ledgers = task_ledgers(requests, outcomes)
    clients: dict[str, Counter[str]] = defaultdict(Counter)
    repos: dict[str, str] = {}
    for r in requests:
        if r.task_id and r.client:
            clients[r.task_id][r.client] += 1
        if r.task_id and r.repo:
            repos.setdefault(r.task_id, r.repo)
    rows = []
    q = query.strip().lower()
    for x in ledgers:
        client = clients[x["task_id"]].most_common(1)[0][0] if clients[x["task_id"]] else ""
        repo = repos.get(x["task_id"], "")
        verdict = "side calls only" if x["side_only"] else verdict_text(x["outcome"])
        haystack = " ".join([x["task_id"], repo, client, verdict, *x["backends"]]).lower()
        if q and q not in haystack:
            continue
        rows.append({**x, "client": client, "repo": repo, "verdict": verdict})
    pages = max(1, -(-len(rows) // TASKS_PER_PAGE))
    page = min(max(1, page), pages)
    first = (page - 1) * TASKS_PER_PAGE
    return {"summary": summary(ledgers), "matched": len(rows), "tasks": rows[first : first + TASKS_PER_PAGE],
            "page": page, "pages": pages, "first": first + 1}  # fmt: skip


def verdict_text(outcome: Mapping[str, Any] | None) -> str:
    if outcome is None:
        return "no verdict yet"
    return f"{'success' if outcome['success'] else 'failure'} ({said_by(outcome)})"


@dataclass(frozen=True, slots=True)
class ShownRequest:
    """A request of the task page: its record, and what the page says of it."""

    r: RequestRecord
    when: str
    ok: bool
    fallbacks: list[TryRecord]  # the tries before the last
    explored: bool


@dataclass(frozen=True, slots=True)
class ShownOutcome:
    o: OutcomeRecord
    verdict: str
    why: str


def verdict_why(o: OutcomeRecord) -> str:
    """What a verdict rests on, from its details: who sent an explicit one, and for an inferred
    one the signals read and whether a tool loop capped the label model's P (else "0.25" beside
    a model that said 0.98 read as a wrong number)."""
    d = o.details or {}
    if o.explicit:
        sender = d.get("client_source")
        return f"sent from {sender}" if isinstance(sender, str) and sender else "sent by the client"
    said = []
    signals = d.get("signals")
    if isinstance(signals, list) and signals:
        said.append(f"signals read: {', '.join(str(s) for s in signals)}")
    alone = d.get("model_p")
    if isinstance(alone, int | float) and not isinstance(alone, bool):
        said.append(f"in a tool loop, P at most {LOOPING_P} (the label model alone: {alone:.2f})")
    return "; ".join(said) or "the label model on the conversation"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def task_detail(
    task_id: str, requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord]
) -> dict[str, Any]:
    """One task's ledger and every request of it, oldest first, with its decision and phases."""
    ledger = task_ledger(task_id, requests, outcomes)
    rows = [ShownRequest(r, _when(r.ts), is_ok(r), (r.tries or [])[:-1], was_explored(r.decision_reason))
            for r in requests]  # fmt: skip
    verdicts = [ShownOutcome(o, verdict_text(final_outcome([o])), verdict_why(o)) for o in outcomes]
    return {"ledger": ledger, "requests": rows, "outcomes": verdicts}
