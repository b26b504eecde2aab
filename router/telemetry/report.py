"""The report of ``router report`` and the dashboard: where the time and the money went, phase by phase, per backend, route, task or policy.

End to end splits into parts that add up to it: queue (arrival → the first try's upstream call:
intake, routing, concurrency waits), retry (the first try's call → the last try's: failed tries
and back-off), prefill (the last try's call → first token), decode (first → last token), upstream
other (the rest of the upstream call: after the last token, or all of it when the reply was not
streamed and no token could be timed) and delivery (last upstream byte → response end).
A phase's *share* is its sum over the group's sum of end to end — time-weighted, so it answers
"where did the time go". Phase statistics cover successful requests only: a fast 400 says
nothing about a backend's latency. Error, retry and fallback rates cover all requests: a
request *retried* when a try was followed by another on the same backend, and *fell back* when
its last try used another backend than an earlier one (``router.telemetry.tries``).

Numbers are only comparable under comparable load, so every group carries its load over the
window: requests per second, and mean concurrency (the sum of end-to-end times over the window's
length). The window runs from the first arrival to the last completion in the selection.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.telemetry import tries
from router.telemetry.ledger import answered, credible, final_outcome

Row = Mapping[str, Any]

GROUP_COLUMNS = {"backend": "chosen_model", "route": "requested_model", "task": "task_id", "policy": "policy",
                 "revision": "policy_revision", "arm": "arm", "key": "key_id"}  # fmt: skip
PHASES = ("queue_ms", "retry_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "gap_max_ms", "upstream_other_ms",
          "delivery_ms", "total_ms")  # fmt: skip
#: The parts of end to end, in time order; they add up to ``total_ms``.
PARTS = {"queue": "queue_ms", "retry": "retry_ms", "prefill": "ttft_ms", "decode": "decode_ms",
         "upstream_other": "upstream_other_ms", "delivery": "delivery_ms"}  # fmt: skip
SETTINGS = ("temperature", "top_p", "max_tokens", "reasoning_effort", "system_sha256", "tools_sha256",
            "provider_model")  # fmt: skip


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); ``ordered`` is sorted."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    v = sorted(values)
    r3: Callable[[float | None], float | None] = lambda x: None if x is None else round(x, 3)  # noqa: E731
    return {"n": len(v), "mean": r3(sum(v) / len(v) if v else None), "p50": r3(quantile(v, 0.5)),
            "p95": r3(quantile(v, 0.95)), "p99": r3(quantile(v, 0.99))}  # fmt: skip


def is_ok(r: Row) -> bool:
    return r.get("status") is not None and r["status"] < 400 and not r.get("error_type")


def with_parts(r: Row) -> dict[str, Any]:
    """The row with ``upstream_other_ms``: end to end less the timed phases (never negative)."""
    out = dict(r)
    total = r.get("total_ms")
    if total is not None and r.get("queue_ms") is not None:
        timed = sum(r.get(c) or 0.0 for p, c in PARTS.items() if p != "upstream_other")
        out["upstream_other_ms"] = max(0.0, total - timed)
    else:
        out["upstream_other_ms"] = None
    return out


def _end(r: Row) -> float:
    return float(r["ts"]) + (r.get("total_ms") or 0.0) / 1000


def _rates(rows: Sequence[Row], tokens: str, ms: str) -> list[float]:
    return [r[tokens] / (r[ms] / 1000) for r in rows if r.get(tokens) and r.get(ms)]


def _settings_differ(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in SETTINGS:
        seen = Counter("unset" if r.get(name) is None else str(r[name]) for r in rows)
        if len(seen) > 1:
            out[name] = dict(seen.most_common())
    return out


def _group(
    key: str, rows: Sequence[Row], verdicts: Mapping[str, dict[str, Any] | None], seconds: float | None
) -> dict[str, Any]:
    n = len(rows)
    ok = [with_parts(r) for r in rows if is_ok(r)]
    total_ok = sum(r["total_ms"] or 0.0 for r in ok if r.get("total_ms") is not None)
    phases: dict[str, Any] = {}
    for phase in PHASES:
        phases[phase] = stats([r[phase] for r in ok if r.get(phase) is not None])
    for column in PARTS.values():
        part_sum = sum(r.get(column) or 0.0 for r in ok if r.get("total_ms") is not None)
        phases[column]["share"] = round(part_sum / total_ok, 4) if total_ok else None
    phases["total_ms"]["share"] = 1.0 if total_ok else None
    n_ok = len(ok) or 1
    inputs = sum(r.get("input_tokens") or 0 for r in rows)
    cost = sum(r.get("cost_usd") or 0.0 for r in rows)
    tasks = {r["task_id"] for r in rows if r.get("task_id")}
    judged = {t for t in tasks if verdicts.get(t) is not None}
    completed = sum(1 for t in judged if (verdicts[t] or {}).get("success"))
    judged_cost = sum(r.get("cost_usd") or 0.0 for r in rows if r.get("task_id") in judged)
    errors = sum(1 for r in rows if not is_ok(r))
    return {
        "key": key,
        "requests": n,
        "ok": len(ok),
        "load": {
            "rps": round(n / seconds, 4) if seconds else None,
            "concurrency": round(sum((r.get("total_ms") or 0.0) for r in rows) / 1000 / seconds, 4)
            if seconds
            else None,
        },
        "phases_ms": phases,
        "mean_parts_ms": {p: round(sum(r.get(c) or 0.0 for r in ok) / n_ok, 3) for p, c in PARTS.items()},
        "prefill_tok_s": stats(_rates(ok, "input_tokens", "ttft_ms")),
        "decode_tok_s": stats(_rates(ok, "output_tokens", "decode_ms")),
        "cached_input_share": round(sum(r.get("cache_read_tokens") or 0 for r in rows) / inputs, 4)
        if inputs
        else None,
        "cost_usd": round(cost, 10),
        "cost_per_request_usd": round(cost / n, 10) if n else None,
        "tasks": {"count": len(tasks), "with_outcome": len(judged), "completed": completed},
        "cost_per_completed_task_usd": round(judged_cost / completed, 10) if completed else None,
        "retries": sum(len(tries.retried(r.get("tries"))) for r in rows),
        "retry_rate": round(sum(1 for r in rows if tries.retried(r.get("tries"))) / n, 4) if n else None,
        "fallbacks": sum(1 for r in rows if tries.fallen_back_from(r.get("tries"))),
        "fallback_rate": round(sum(1 for r in rows if tries.fallen_back_from(r.get("tries"))) / n, 4)
        if n
        else None,
        "error_rate": round(errors / n, 4) if n else None,
        "settings_differ": _settings_differ(rows),
    }


def build_report(
    requests: Sequence[Row], outcomes: Sequence[Row], *, by: str = "backend",
    since: float | None = None, until: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The report as JSON-ready data (``--json`` prints exactly this)."""
    column = GROUP_COLUMNS[by]
    start = min((float(r["ts"]) for r in requests), default=None)
    end = max((_end(r) for r in requests), default=None)
    seconds = (end - start) if start is not None and end is not None and end > start else None
    by_task: dict[str, list[Row]] = defaultdict(list)
    for o in credible(outcomes, answered(requests)):
        by_task[o["task_id"]].append(o)
    verdicts = {t: final_outcome(os) for t, os in by_task.items()}
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in requests:
        groups[str(r.get(column) or "(none)")].append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return {
        "by": by,
        "since": since,
        "until": until,
        "window": {
            "start": start,
            "end": end,
            "seconds": round(seconds, 3) if seconds else None,
            "requests": len(requests),
            "rps": round(len(requests) / seconds, 4) if seconds else None,
            "concurrency": round(sum(r.get("total_ms") or 0.0 for r in requests) / 1000 / seconds, 4)
            if seconds
            else None,
        },
        "groups": [_group(k, rows, verdicts, seconds) for k, rows in ordered],
    }


# ---- rendering
