"""Turning measured cells into one table, a summary with ratios, and JSON."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.loadgen import CellResult

_CPUS = os.cpu_count() or 1
UPSTREAM, ROUTER, LITELLM, PASSTHROUGH = "upstream", "router", "litellm", "floor"
#: Issue 8's targets for the router (one worker on one core).
TARGET_ADDED_P50_MS, TARGET_ADDED_P99_MS = 1.0, 2.0
TARGET_RPS = {"chat": 1000.0, "chat-stream": 700.0}
TARGET_VS_LITELLM = {"chat": 10.0, "chat-stream": 20.0}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Row:
    scenario: str
    concurrency: int
    target: str
    result: CellResult

    @property
    def p50(self) -> float:
        return percentile(self.result.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.result.latencies_ms, 99)

    @property
    def ttft50(self) -> float:
        return percentile(self.result.ttfts_ms, 50)

    @property
    def ttft99(self) -> float:
        return percentile(self.result.ttfts_ms, 99)

    @property
    def server_cpu_s(self) -> float:
        return self.result.cpu_s.get("server", math.nan)

    @property
    def cpu_ms_per_request(self) -> float:
        n = self.result.requests
        return self.server_cpu_s * 1000 / n if n else math.nan

    @property
    def cpu_share(self) -> float:
        w = self.result.window_s
        return self.server_cpu_s / w if w else math.nan

    @property
    def wait_share(self) -> float:
        """Share of the window the server's threads were runnable but had no CPU."""
        w = self.result.window_s
        return self.result.cpu_s.get("server_wait", math.nan) / w if w else math.nan

    @property
    def steal_share(self) -> float:
        """Share of the machine's CPU time (all cores) the hypervisor gave elsewhere in the window."""
        w = self.result.window_s
        return self.result.cpu_s.get("steal", math.nan) / (w * _CPUS) if w else math.nan

    @property
    def driver_share(self) -> float:
        """Busy share of the driver core: the load generator plus the upstream."""
        w, cpu = self.result.window_s, self.result.cpu_s
        return (cpu.get("generator", math.nan) + cpu.get("upstream", math.nan)) / w if w else math.nan

    def as_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "scenario": self.scenario, "concurrency": self.concurrency, "target": self.target,
            "requests": r.requests, "errors": r.errors, "window_s": r.window_s, "rps": r.rps,
            "latency_p50_ms": self.p50, "latency_p99_ms": self.p99,
            "ttft_p50_ms": self.ttft50, "ttft_p99_ms": self.ttft99,
            "cpu_ms_per_request": self.cpu_ms_per_request, "cpu_share": self.cpu_share,
            "cpu_wait_share": self.wait_share, "steal_share": self.steal_share,
            "driver_core_share": self.driver_share, "first_error": r.first_error,
        }  # fmt: skip


def _find(rows: Iterable[Row], scenario: str, concurrency: int, target: str) -> Row | None:
    return next(
        (r for r in rows if (r.scenario, r.concurrency, r.target) == (scenario, concurrency, target)), None
    )


def _num(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:,.{digits}f}"


def _added(value: float, base: float) -> str:
    return "–" if math.isnan(value) or math.isnan(base) else f"{value - base:+.2f}"


def table(rows: Sequence[Row]) -> str:
    """One Markdown table: every cell's rows side by side, with added latency and the router÷LiteLLM ratio."""
    header = [
        "scenario", "conc", "target", "req/s", "p50 ms", "p99 ms", "TTFT p50", "TTFT p99",
        "CPU ms/req", "CPU %", "CPU wait %", "steal %", "driver core %", "+p50 ms", "+TTFT p50", "÷ LiteLLM req/s", "errors",
    ]  # fmt: skip
    lines = [header]
    for row in rows:
        base = _find(rows, row.scenario, row.concurrency, UPSTREAM)
        litellm = _find(rows, row.scenario, row.concurrency, LITELLM)
        added = row.target != UPSTREAM and base is not None
        ratio = "–"
        if row.target == ROUTER and litellm is not None and litellm.result.rps > 0:
            ratio = f"{row.result.rps / litellm.result.rps:.1f}×"
        lines.append(
            [
                row.scenario, str(row.concurrency), row.target, _num(row.result.rps, 0),
                _num(row.p50), _num(row.p99), _num(row.ttft50), _num(row.ttft99),
                _num(row.cpu_ms_per_request), _num(row.cpu_share * 100, 0), _num(row.wait_share * 100, 0),
                _num(row.steal_share * 100, 0), _num(row.driver_share * 100, 0),
                _added(row.p50, base.p50) if added and base else "–",
                _added(row.ttft50, base.ttft50) if added and base else "–",
                ratio, str(row.result.errors),
            ]
        )  # fmt: skip
    return _markdown(lines)


def _markdown(lines: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]

    def fmt(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if i < 3 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = (
        "|" + "|".join("-" * (w + 1) + ":" if i >= 3 else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    )
    return "\n".join([fmt(lines[0]), rule, *(fmt(line) for line in lines[1:])])


def best_rps(rows: Sequence[Row], scenario: str, target: str) -> tuple[float, int]:
    """The highest throughput of a target in a scenario, and the concurrency it came at."""
    found = [(r.result.rps, r.concurrency) for r in rows if r.scenario == scenario and r.target == target]
    return max(found, default=(math.nan, 0))


def summary(rows: Sequence[Row]) -> str:
    """Max throughput with ratios, added latency at concurrency 1, and issue 8's targets."""
    out = ["Max throughput (best over concurrency levels), req/s:"]
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    for sc in scenarios:
        up, router, lite, floor = (best_rps(rows, sc, t) for t in (UPSTREAM, ROUTER, LITELLM, PASSTHROUGH))
        ratio = router[0] / lite[0] if lite[0] and not math.isnan(lite[0]) else math.nan
        share = router[0] / floor[0] if floor[0] and not math.isnan(floor[0]) else math.nan
        out.append(
            f"  {sc:<20} upstream {_num(up[0], 0):>7} (c={up[1]})   floor {_num(floor[0], 0):>7} (c={floor[1]})"
            f"   router {_num(router[0], 0):>7} (c={router[1]})   litellm {_num(lite[0], 0):>7} (c={lite[1]})"
            f"   router/litellm {_num(ratio, 1)}×   router/floor {_num(share * 100, 0)}%"
        )
    out.append("Added latency at concurrency 1 (vs the upstream directly), ms — p50 / p99:")
    for sc in scenarios:
        base = _find(rows, sc, 1, UPSTREAM)
        if base is None:
            continue
        for target in (PASSTHROUGH, ROUTER, LITELLM):
            row = _find(rows, sc, 1, target)
            if row is None:
                continue
            stream = bool(row.result.ttfts_ms)
            what = "TTFT" if stream else "latency"
            a50 = (row.ttft50 - base.ttft50) if stream else (row.p50 - base.p50)
            a99 = (row.ttft99 - base.ttft99) if stream else (row.p99 - base.p99)
            out.append(f"  {sc:<20} {target:<8} {what:<8} {_num(a50)} / {_num(a99)}")
    out.extend(_targets(rows))
    return "\n".join(out)


def _targets(rows: Sequence[Row]) -> list[str]:
    out = ["Issue 8 targets (router):"]

    def mark(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def added(sc: str, target: str) -> tuple[float, float] | None:
        base, row = _find(rows, sc, 1, UPSTREAM), _find(rows, sc, 1, target)
        if base is None or row is None:
            return None
        if sc != "chat":
            return row.ttft50 - base.ttft50, row.ttft99 - base.ttft99
        return row.p50 - base.p50, row.p99 - base.p99

    for sc in ("chat", "chat-stream"):
        router, floor = added(sc, ROUTER), added(sc, PASSTHROUGH)
        if router is not None:
            a50, a99 = router
            out.append(
                f"  {sc}: added p50 {_num(a50)} ms (≤ {TARGET_ADDED_P50_MS:g}: {mark(a50 <= TARGET_ADDED_P50_MS)}),"
                f" p99 {_num(a99)} ms (≤ {TARGET_ADDED_P99_MS:g}: {mark(a99 <= TARGET_ADDED_P99_MS)})"
                + (f"; the floor adds {_num(floor[0])} / {_num(floor[1])} ms here" if floor else "")
            )
        rps, _ = best_rps(rows, sc, ROUTER)
        lite, _ = best_rps(rows, sc, LITELLM)
        floor_rps, _ = best_rps(rows, sc, PASSTHROUGH)
        if not math.isnan(rps):
            line = f"  {sc}: max {rps:,.0f} req/s (≥ {TARGET_RPS[sc]:,.0f}: {mark(rps >= TARGET_RPS[sc])})"
            if not math.isnan(floor_rps):
                line += f" (the floor: {floor_rps:,.0f})"
            if not math.isnan(lite) and lite > 0:
                x = rps / lite
                line += (
                    f", {x:.1f}× LiteLLM (≥ {TARGET_VS_LITELLM[sc]:g}×: {mark(x >= TARGET_VS_LITELLM[sc])})"
                )
            out.append(line)
    return out
