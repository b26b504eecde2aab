"""`router report`: the report (``router.telemetry.report``) as tables, JSON or a plot."""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from router.errors import ConfigError
from router.store import RequestRecord
from router.telemetry.ledger import usd
from router.telemetry.report import GROUPS, PARTS, build_report, is_ok, phase_values

#: Groups shown in the tables and the plot (all of them are in --json).
MAX_TABLE_GROUPS = 30


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
    from rich.text import Text

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
    # "spend" first among the costs: $/req alone left a group's total to multiply out by hand.
    for col in ("group", "reqs", "req/s", "conc", "errors", "retried", "fell back", "cached in", "spend", "$/req",
                "$/done task", "prefill tok/s", "decode tok/s"):  # fmt: skip
        summary.add_column(col, justify="left" if col == "group" else "right")
    for g in groups:
        per_task = g["cost_per_completed_task_usd"]
        if per_task is None:
            per_task_text = "n/a" if not g["tasks"]["with_outcome"] else "none completed"
        else:
            per_task_text = usd(per_task)
        summary.add_row(
            tables.literal(g["key"]), str(g["requests"]), _num(g["load"]["rps"], "{:.3f}"),
            _num(g["load"]["concurrency"], "{:.2f}"), _pct(g["error_rate"]), _pct(g["retry_rate"]),
            _pct(g["fallback_rate"]), _pct(g["cached_input_share"]), usd(g["cost_usd"]), usd(g["cost_per_request_usd"] or 0.0), per_task_text,
            _num(g["prefill_tok_s"]["p50"], "{:.0f}"), _num(g["decode_tok_s"]["p50"], "{:.1f}"),
        )  # fmt: skip
    tables.show(console, summary)
    phases = Table(title="Phases in ms (successful requests); share of end to end", title_justify="left")
    for col in ("group", "phase", "n", "p50", "p95", "p99", "share"):
        phases.add_column(col, justify="left" if col in ("group", "phase") else "right")
    for g in groups:
        for i, (phase, s) in enumerate(g["phases_ms"].items()):
            phases.add_row(tables.literal(g["key"] if i == 0 else ""), phase.removesuffix("_ms"), str(s["n"]), _ms(s["p50"]),
                           _ms(s["p95"]), _ms(s["p99"]), _pct(s.get("share")),
                           end_section=i == len(g["phases_ms"]) - 1)  # fmt: skip
    tables.show(console, phases)
    for g in groups:
        for name, values in g["settings_differ"].items():
            shown = ", ".join(f"{v[:12]} x{n}" for v, n in list(values.items())[:5])
            said = tables.literal(f"{name} differs within the group: {shown}")
            console.print(Text.assemble((tables.literal(g["key"]).plain, "yellow"), ": ", said))
    if len(report["groups"]) > len(groups):
        console.print(f"… {len(report['groups']) - len(groups)} more groups (all of them are in --json)")


def log_axis(sub: Any) -> None:
    """A log x axis labelled at its decades, in plain numbers (0.1, 1, 10): over less than two
    decades matplotlib also labels the minor ticks, "2×10⁻¹ 3×10⁻¹ ..." overlapping."""
    from matplotlib import ticker

    sub.set_xscale("log")
    sub.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    sub.xaxis.set_minor_formatter(ticker.NullFormatter())


def plot(report: Mapping[str, Any], requests: Sequence[RequestRecord], path: str) -> str:
    """Stacked mean phases per group, and each phase's distribution per group, as a PNG (or the
    format ``path``'s suffix names); returns the file written."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    groups = report["groups"][:MAX_TABLE_GROUPS]
    keys = [g["key"] for g in groups]
    # Drawn as matplotlib reads text, "$...$" is TeX: a model named "$\\fracc{x$" (a client's
    # string) stopped the plot with a ParseSyntaxException. Its dollars are drawn as they are.
    labels = {k: k.replace("$", r"\$") for k in keys}
    group_of = GROUPS[report["by"]]
    rows: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if is_ok(r):
            rows[group_of(r) or "(none)"].append(r)
    fig = plt.figure(figsize=(15, 3 + 0.35 * max(len(keys), 4)), layout="constrained")
    grid = fig.add_gridspec(2, 3)
    ax = fig.add_subplot(grid[:, 0])
    left = [0.0] * len(keys)
    for part in PARTS:
        widths = [g["mean_parts_ms"][part] for g in groups]
        ax.barh([labels[k] for k in keys], widths, left=left, label=part.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("mean ms per successful request")
    ax.set_title("Where end to end goes")
    ax.legend(loc="lower right", fontsize="small")
    for i, phase in enumerate(("queue_ms", "ttft_ms", "decode_ms", "total_ms")):
        sub = fig.add_subplot(grid[i // 2, 1 + i % 2])
        data = [phase_values(rows[k], phase) for k in keys]
        present = [(k, d) for k, d in zip(keys, data, strict=True) if d]
        if present:
            values = [[max(v, 0.01) for v in d] for _, d in present]  # a log axis cannot show 0
            sub.boxplot(
                values, orientation="horizontal", tick_labels=[labels[k] for k, _ in present], whis=(1, 99)
            )
            sub.invert_yaxis()
            lo, hi = min(min(v) for v in values), max(max(v) for v in values)
            if hi / lo > 20:  # tails over orders of magnitude: only a log axis shows both ends
                log_axis(sub)
        sub.set_title(f"{phase.removesuffix('_ms')} (ms, whiskers p1-p99)")
    w = report["window"]
    fig.suptitle(f"{w['requests']} requests by {report['by']}: {_num(w['rps'], '{:.3f}')} req/s, "
                 f"mean concurrency {_num(w['concurrency'], '{:.2f}')}")  # fmt: skip
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a format it cannot write ("report.txt"): a traceback before
        raise ConfigError(f"--plot {path}: {exc}") from None
    finally:
        plt.close(fig)
    # Without a suffix matplotlib writes a PNG and adds ".png": said as written, the plot was not
    # where the line said.
    return path if PurePath(path).suffix else f"{path}.png"


def run_report(args: argparse.Namespace) -> int:
    import orjson

    from router.store.window import parse_duration, read_window

    window = asyncio.run(read_window(args.store, parse_duration(args.since)))
    report = build_report(
        window.requests,
        window.outcomes,
        by=args.by,
        since=window.since,
        until=window.until,
    )
    written = plot(report, window.requests, args.plot) if args.plot else None
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        render(report)
        if written:
            print(f"plot written to {written}")
    return 0
