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
from collections.abc import Set as AbstractSet
from typing import Any

from router.store import OutcomeRecord, RequestRecord
from router.telemetry import tries
from router.telemetry.ledger import side_only, task_verdicts

Read = Callable[[RequestRecord], Any]

#: What ``--by`` groups on.
GROUPS: dict[str, Callable[[RequestRecord], str | None]] = {
    "backend": lambda r: r.chosen_model, "route": lambda r: r.requested_model, "task": lambda r: r.task_id,
    "policy": lambda r: r.policy, "revision": lambda r: r.policy_revision, "arm": lambda r: r.arm,
    "key": lambda r: r.key_id,
}  # fmt: skip
#: The settings a group's requests should share (``settings_differ`` says where they do not).
SETTINGS: dict[str, Read] = {
    "temperature": lambda r: r.temperature, "top_p": lambda r: r.top_p, "max_tokens": lambda r: r.max_tokens,
    "reasoning_effort": lambda r: r.reasoning_effort, "system_sha256": lambda r: r.system_sha256,
    "tools_sha256": lambda r: r.tools_sha256, "provider_model": lambda r: r.provider_model,
}  # fmt: skip


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


def is_ok(r: RequestRecord) -> bool:
    return r.status is not None and r.status < 400 and not r.error_type


def upstream_other_ms(r: RequestRecord) -> float | None:
    """End to end less the timed phases (never negative)."""
    if r.total_ms is None or r.queue_ms is None:
        return None
    timed = (r.queue_ms or 0.0) + (r.retry_ms or 0.0) + (r.ttft_ms or 0.0) + (r.decode_ms or 0.0)
    return max(0.0, r.total_ms - timed - (r.delivery_ms or 0.0))


#: The phases of a request (milliseconds), in time order with the gaps beside decode.
PHASES: dict[str, Callable[[RequestRecord], float | None]] = {
    "queue_ms": lambda r: r.queue_ms, "retry_ms": lambda r: r.retry_ms, "ttft_ms": lambda r: r.ttft_ms,
    "decode_ms": lambda r: r.decode_ms, "gap_mean_ms": lambda r: r.gap_mean_ms, "gap_max_ms": lambda r: r.gap_max_ms,
    "upstream_other_ms": upstream_other_ms, "delivery_ms": lambda r: r.delivery_ms, "total_ms": lambda r: r.total_ms,
}  # fmt: skip
#: The parts of end to end (by their phase), in time order; they add up to ``total_ms``.
PARTS = {"queue": "queue_ms", "retry": "retry_ms", "prefill": "ttft_ms", "decode": "decode_ms",
         "upstream_other": "upstream_other_ms", "delivery": "delivery_ms"}  # fmt: skip


def phase_values(rows: Sequence[RequestRecord], phase: str) -> list[float]:
    """The rows' values of one of ``PHASES``, where they have one."""
    read = PHASES[phase]
    return [v for v in map(read, rows) if v is not None]


def _end(r: RequestRecord) -> float:
    return r.ts + (r.total_ms or 0.0) / 1000


def _rates(rows: Sequence[RequestRecord], tokens: Read, ms: Read) -> list[float]:
    return [n / (t / 1000) for n, t in ((tokens(r), ms(r)) for r in rows) if n and t]


def _settings_differ(rows: Sequence[RequestRecord]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, read in SETTINGS.items():
        seen = Counter("unset" if v is None else str(v) for v in map(read, rows))
        if len(seen) > 1:
            out[name] = dict(seen.most_common())
    return out


def _group(
    key: str,
    rows: Sequence[RequestRecord],
    verdicts: Mapping[str, OutcomeRecord | None],
    seconds: float | None,
    alone: AbstractSet[str] = frozenset(),
) -> dict[str, Any]:
    """``alone``: the tasks of side calls alone (``ledger.side_only``), not counted as tasks."""
    n = len(rows)
    ok = [r for r in rows if is_ok(r)]
    timed = [r for r in ok if r.total_ms is not None]
    total_ok = sum(r.total_ms or 0.0 for r in timed)
    # Each phase's values are read once: the dashboard's overview reports six groupings of a
    # window of up to 20,000 requests, and reading them again for the means cost a fifth of it.
    values = {phase: phase_values(ok, phase) for phase in PHASES}
    phases: dict[str, Any] = {phase: stats(v) for phase, v in values.items()}
    for phase in PARTS.values():
        part_sum = sum(phase_values(timed, phase))
        phases[phase]["share"] = round(part_sum / total_ok, 4) if total_ok else None
    phases["total_ms"]["share"] = 1.0 if total_ok else None
    n_ok = len(ok) or 1
    inputs = sum(r.input_tokens or 0 for r in rows)
    cost = sum(r.cost_usd or 0.0 for r in rows)
    tasks = {r.task_id for r in rows if r.task_id and r.task_id not in alone}
    judged = {t for t in tasks if verdicts.get(t) is not None}
    completed = sum(1 for t in judged if (v := verdicts[t]) is not None and v.success)
    judged_cost = sum(r.cost_usd or 0.0 for r in rows if r.task_id in judged)
    errors = sum(1 for r in rows if not is_ok(r))
    return {
        "key": key,
        "requests": n,
        "ok": len(ok),
        "load": {
            "rps": round(n / seconds, 4) if seconds else None,
            "concurrency": round(sum((r.total_ms or 0.0) for r in rows) / 1000 / seconds, 4)
            if seconds
            else None,
        },
        "phases_ms": phases,
        "mean_parts_ms": {p: round(sum(values[phase]) / n_ok, 3) for p, phase in PARTS.items()},
        "prefill_tok_s": stats(_rates(ok, lambda r: r.input_tokens, lambda r: r.ttft_ms)),
        "decode_tok_s": stats(_rates(ok, lambda r: r.output_tokens, lambda r: r.decode_ms)),
        "cached_input_share": round(sum(r.cache_read_tokens or 0 for r in rows) / inputs, 4)
        if inputs
        else None,
        "cost_usd": round(cost, 10),
        "cost_per_request_usd": round(cost / n, 10) if n else None,
        "tasks": {"count": len(tasks), "with_outcome": len(judged), "completed": completed},
        "cost_per_completed_task_usd": round(judged_cost / completed, 10) if completed else None,
        "retries": sum(len(tries.retried(r.tries)) for r in rows),
        "retry_rate": round(sum(1 for r in rows if tries.retried(r.tries)) / n, 4) if n else None,
        "fallbacks": sum(1 for r in rows if tries.fallen_back_from(r.tries)),
        "fallback_rate": round(sum(1 for r in rows if tries.fallen_back_from(r.tries)) / n, 4) if n else None,
        "error_rate": round(errors / n, 4) if n else None,
        "settings_differ": _settings_differ(rows),
    }


def build_report(
    requests: Sequence[RequestRecord], outcomes: Sequence[OutcomeRecord], *, by: str = "backend",
    since: float | None = None, until: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The report as JSON-ready data (``--json`` prints exactly this)."""
    group_of = GROUPS[by]
    start = min((r.ts for r in requests), default=None)
    end = max((_end(r) for r in requests), default=None)
    seconds = (end - start) if start is not None and end is not None and end > start else None
    verdicts = task_verdicts(requests, outcomes)
    alone = side_only(requests, verdicts)
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        groups[group_of(r) or "(none)"].append(r)
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
            "concurrency": round(sum(r.total_ms or 0.0 for r in requests) / 1000 / seconds, 4)
            if seconds
            else None,
        },
        "groups": [_group(k, rows, verdicts, seconds, alone) for k, rows in ordered],
    }


# ---- rendering
