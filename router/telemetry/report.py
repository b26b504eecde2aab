"""``router report``: where the time and the money went, phase by phase, per backend, route, task or policy.

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

import argparse
import asyncio
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.errors import ConfigError
from router.telemetry import tries
from router.telemetry.ledger import answered, credible, final_outcome, usd

Row = Mapping[str, Any]

GROUP_COLUMNS = {"backend": "chosen_model", "route": "requested_model", "task": "task_id", "policy": "policy",
                 "revision": "policy_revision", "arm": "arm"}  # fmt: skip
PHASES = ("queue_ms", "retry_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "gap_max_ms", "upstream_other_ms",
          "delivery_ms", "total_ms")  # fmt: skip
#: The parts of end to end, in time order; they add up to ``total_ms``.
PARTS = {"queue": "queue_ms", "retry": "retry_ms", "prefill": "ttft_ms", "decode": "decode_ms",
         "upstream_other": "upstream_other_ms", "delivery": "delivery_ms"}  # fmt: skip
SETTINGS = ("temperature", "top_p", "max_tokens", "reasoning_effort", "system_sha256", "tools_sha256",
            "provider_model")  # fmt: skip
MAX_TABLE_GROUPS = 30


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


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:.1f}s"
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if x is None else fmt.format(x)


def render(report: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from router.telemetry import tables

    console = Console(soft_wrap=True)  # long lines stay whole, for a pager or grep
    w = report["window"]
    console.print(
        f"[bold]{w['requests']} requests[/] over {_num(w['seconds'], '{:.1f}')} s: "
        f"{_num(w['rps'], '{:.3f}')} req/s, mean concurrency {_num(w['concurrency'], '{:.2f}')} "
        f"— grouped by {report['by']}"
    )
    groups = report["groups"][:MAX_TABLE_GROUPS]
    summary = Table(title="Load, errors, cache, cost; token rates are medians", title_justify="left")
    for col in ("group", "reqs", "req/s", "conc", "errors", "retried", "fell back", "cached in", "$/req",
                "$/done task", "prefill tok/s", "decode tok/s"):  # fmt: skip
        summary.add_column(col, justify="left" if col == "group" else "right")
    for g in groups:
        per_task = g["cost_per_completed_task_usd"]
        if per_task is None:
            per_task_text = "n/a" if not g["tasks"]["with_outcome"] else "none completed"
        else:
            per_task_text = usd(per_task)
        summary.add_row(
            g["key"], str(g["requests"]), _num(g["load"]["rps"], "{:.3f}"),
            _num(g["load"]["concurrency"], "{:.2f}"), _pct(g["error_rate"]), _pct(g["retry_rate"]),
            _pct(g["fallback_rate"]), _pct(g["cached_input_share"]), usd(g["cost_per_request_usd"] or 0.0), per_task_text,
            _num(g["prefill_tok_s"]["p50"], "{:.0f}"), _num(g["decode_tok_s"]["p50"], "{:.1f}"),
        )  # fmt: skip
    tables.show(console, summary)
    phases = Table(title="Phases in ms (successful requests); share of end to end", title_justify="left")
    for col in ("group", "phase", "n", "p50", "p95", "p99", "share"):
        phases.add_column(col, justify="left" if col in ("group", "phase") else "right")
    for g in groups:
        for i, (phase, s) in enumerate(g["phases_ms"].items()):
            phases.add_row(g["key"] if i == 0 else "", phase.removesuffix("_ms"), str(s["n"]), _ms(s["p50"]),
                           _ms(s["p95"]), _ms(s["p99"]), _pct(s.get("share")),
                           end_section=i == len(g["phases_ms"]) - 1)  # fmt: skip
    tables.show(console, phases)
    for g in groups:
        for name, values in g["settings_differ"].items():
            shown = ", ".join(f"{v[:12]} x{n}" for v, n in list(values.items())[:5])
            console.print(f"[yellow]{g['key']}[/]: {name} differs within the group: {shown}")
    if len(report["groups"]) > len(groups):
        console.print(f"… {len(report['groups']) - len(groups)} more groups (all of them are in --json)")


def plot(report: Mapping[str, Any], requests: Sequence[Row], path: str) -> None:
    """Stacked mean phases per group, and each phase's distribution per group, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    groups = report["groups"][:MAX_TABLE_GROUPS]
    keys = [g["key"] for g in groups]
    column = GROUP_COLUMNS[report["by"]]
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in requests:
        if is_ok(r):
            rows[str(r.get(column) or "(none)")].append(with_parts(r))
    fig = plt.figure(figsize=(15, 3 + 0.35 * max(len(keys), 4)), layout="constrained")
    grid = fig.add_gridspec(2, 3)
    ax = fig.add_subplot(grid[:, 0])
    left = [0.0] * len(keys)
    for part in PARTS:
        widths = [g["mean_parts_ms"][part] for g in groups]
        ax.barh(keys, widths, left=left, label=part.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("mean ms per successful request")
    ax.set_title("Where end to end goes")
    ax.legend(loc="lower right", fontsize="small")
    for i, phase in enumerate(("queue_ms", "ttft_ms", "decode_ms", "total_ms")):
        sub = fig.add_subplot(grid[i // 2, 1 + i % 2])
        data = [[r[phase] for r in rows[k] if r.get(phase) is not None] for k in keys]
        present = [(k, d) for k, d in zip(keys, data, strict=True) if d]
        if present:
            values = [[max(v, 0.01) for v in d] for _, d in present]  # a log axis cannot show 0
            sub.boxplot(values, orientation="horizontal", tick_labels=[k for k, _ in present], whis=(1, 99))
            sub.invert_yaxis()
            lo, hi = min(min(v) for v in values), max(max(v) for v in values)
            if hi / lo > 20:  # tails over orders of magnitude: only a log axis shows both ends
                sub.set_xscale("log")
        sub.set_title(f"{phase.removesuffix('_ms')} (ms, whiskers p1-p99)")
    w = report["window"]
    fig.suptitle(f"{w['requests']} requests by {report['by']}: {_num(w['rps'], '{:.3f}')} req/s, "
                 f"mean concurrency {_num(w['concurrency'], '{:.2f}')}")  # fmt: skip
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def run_report(args: argparse.Namespace) -> int:
    import orjson

    from router.store.window import parse_duration, read_window

    window = asyncio.run(read_window(args.store, parse_duration(args.since)))
    report = build_report(
        window.requests, window.outcomes, by=args.by, since=window.since, until=window.until
    )
    if args.plot:
        plot(report, window.requests, args.plot)
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        render(report)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
