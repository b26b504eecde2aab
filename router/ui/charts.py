"""Charts as inline SVG, drawn on the server: no JavaScript, no chart library, nothing fetched.

Each function takes plain numbers and labels and returns ``Markup`` ready to put in a template;
every label is escaped here. Colours come from one palette keyed by the series' position, so a
backend keeps its colour across the charts of one page when the callers pass the same order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")  # fmt: skip
LABEL_W = 150  # room for a label left of horizontal bars
ROW_H = 22
WIDTH = 560


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _svg(width: int, height: int, body: list[str], title: str) -> Markup:
    return Markup(
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{"".join(body)}</svg>'
    )


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


Fmt = str | Callable[[float], str]


def _formatter(fmt: Fmt) -> Callable[[float], str]:
    """A format string's ``format``, or the function itself (money: never in exponent form)."""
    return fmt.format if isinstance(fmt, str) else fmt


def hbars(items: Sequence[tuple[str, float | None]], *, title: str, fmt: Fmt = "{:.4g}") -> Markup:
    """One horizontal bar per (label, value); a value of None is drawn as 'n/a'."""
    if not items:
        return Markup("")
    f = _formatter(fmt)
    top = max((v for _, v in items if v is not None), default=0.0) or 1.0
    plot_w = WIDTH - LABEL_W - 70
    body: list[str] = []
    for i, (label, value) in enumerate(items):
        y = i * ROW_H
        body.append(_text(LABEL_W - 6, y + 15, label, "end"))
        if value is None:
            body.append(_text(LABEL_W, y + 15, "n/a", cls="muted"))
            continue
        w = max(1.0, plot_w * value / top)
        body.append(f'<rect x="{LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{ROW_H - 6}" fill="{colour(i)}">'
                    f"<title>{escape(label)}: {escape(f(value))}</title></rect>")  # fmt: skip
        body.append(_text(LABEL_W + w + 4, y + 15, f(value)))
    return _svg(WIDTH, ROW_H * len(items) + 4, body, title)


def share_bar(items: Sequence[tuple[str, float]], *, title: str) -> Markup:
    """One bar split into each item's share of the total, with a legend below."""
    total = sum(v for _, v in items)
    if total <= 0:
        return Markup("")
    plot_w = WIDTH - 2
    body: list[str] = []
    x = 1.0
    for i, (label, value) in enumerate(items):
        w = plot_w * value / total
        pct = f"{100 * value / total:.1f}%"
        body.append(f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="24" fill="{colour(i)}">'
                    f"<title>{escape(label)}: {pct}</title></rect>")  # fmt: skip
        if w > 40:
            body.append(_text(x + w / 2, 19, pct, "middle", "on-bar"))
        x += w
    for i, (label, value) in enumerate(items):
        y = 34 + i * 18
        body.append(f'<rect x="1" y="{y}" width="12" height="12" fill="{colour(i)}"/>')
        body.append(_text(18, y + 11, f"{label} — {value:g} ({100 * value / total:.1f}%)"))
    return _svg(WIDTH, 34 + 18 * len(items) + 4, body, title)


def columns(buckets: Sequence[tuple[str, float]], *, title: str, fmt: Fmt = "{:g}") -> Markup:
    """Vertical bars over time (labels under the first, middle and last bar)."""
    if not buckets:
        return Markup("")
    f = _formatter(fmt)
    height, base = 120, 100
    top = max(v for _, v in buckets) or 1.0
    step = (WIDTH - 40) / len(buckets)
    body = [f'<line x1="30" y1="{base}" x2="{WIDTH}" y2="{base}" class="axis"/>',
            _text(32, 12, f"max {f(top)}", "start", "muted")]  # fmt: skip
    for i, (label, value) in enumerate(buckets):
        h = (base - 8) * value / top
        x = 32 + i * step
        body.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" '
                    f'fill="{colour(0)}"><title>{escape(label)}: {escape(f(value))}</title></rect>')  # fmt: skip
    for i in sorted({0, len(buckets) // 2, len(buckets) - 1}):
        body.append(_text(32 + i * step + step / 2, height - 4, buckets[i][0], "middle", "muted"))
    return _svg(WIDTH, height, body, title)


def quantiles(
    rows: Sequence[tuple[str, float | None, float | None, float | None]], *, title: str, log: bool = True
) -> Markup:
    """Per (label, p50, p95, p99): a solid bar to p50, a lighter one on to p95, a tick at p99.

    Latencies span orders of magnitude (a queue of 0.2 ms beside a decode of 20 s), so the axis is
    logarithmic by default; a tick label under it says where 1, 10, 100 … ms are.
    """
    present = [r for r in rows if r[1] is not None]
    if not present:
        return Markup("")
    hi = max(v for r in present for v in r[1:] if v is not None)
    lo = min(v for r in present for v in r[1:] if v is not None)
    lo = 10 ** math.floor(math.log10(max(min(lo, 1.0), 0.01)))  # the axis starts at a decade
    plot_w = WIDTH - LABEL_W - 20

    def x(v: float) -> float:
        if not log:
            return LABEL_W + plot_w * v / (hi or 1.0)
        span = math.log10(max(hi, lo * 10)) - math.log10(lo)
        return LABEL_W + plot_w * (math.log10(max(v, lo)) - math.log10(lo)) / span

    body: list[str] = []
    for i, (label, p50, p95, p99) in enumerate(rows):
        y = i * ROW_H
        body.append(_text(LABEL_W - 6, y + 15, label, "end"))
        if p50 is None:
            body.append(_text(LABEL_W, y + 15, "no data", cls="muted"))
            continue
        tip = escape(f"{label}: p50 {p50:.1f} ms, p95 {(p95 or p50):.1f} ms, p99 {(p99 or p50):.1f} ms")
        body.append(f'<rect x="{LABEL_W}" y="{y + 4}" width="{x(p50) - LABEL_W:.1f}" height="{ROW_H - 8}" '
                    f'fill="{colour(0)}"><title>{tip}</title></rect>')  # fmt: skip
        if p95 is not None and p95 > p50:
            body.append(f'<rect x="{x(p50):.1f}" y="{y + 4}" width="{x(p95) - x(p50):.1f}" height="{ROW_H - 8}" '
                        f'fill="{colour(0)}" opacity="0.4"><title>{tip}</title></rect>')  # fmt: skip
        if p99 is not None:
            body.append(
                f'<line x1="{x(p99):.1f}" y1="{y + 2}" x2="{x(p99):.1f}" y2="{y + ROW_H - 2}" class="p99"/>'
            )
    axis_y = ROW_H * len(rows) + 12
    if log:
        decade = lo
        while decade <= hi * 1.0001:
            body.append(_text(x(decade), axis_y, f"{decade:g} ms", "middle", "muted"))
            decade *= 10
    return _svg(WIDTH, axis_y + 4, body, title)


def intervals(
    rows: Sequence[tuple[str, float | None, float | None, float | None]], *, title: str,
    fmt: Callable[[float], str] = "{:.3g}".format, top: float | None = None,
) -> Markup:  # fmt: skip
    """Per (label, value, low, high): a dot at the value on a line from low to high (an interval),
    on a linear axis from 0 to ``top`` (default: the highest end); a value of None is 'n/a'."""
    present = [r for r in rows if r[1] is not None]
    if not present:
        return Markup("")
    hi = top or max(max(v for v in r[1:] if v is not None) for r in present) or 1.0
    plot_w = WIDTH - LABEL_W - 90

    def x(v: float) -> float:
        return LABEL_W + plot_w * min(max(v, 0.0), hi) / hi

    body: list[str] = []
    for i, (label, value, lo, high) in enumerate(rows):
        y = i * ROW_H + 11
        body.append(_text(LABEL_W - 6, y + 4, label, "end"))
        if value is None:
            body.append(_text(LABEL_W, y + 4, "n/a", cls="muted"))
            continue
        a, b = (value if lo is None else lo), (value if high is None else high)
        shown = fmt(value) + ("" if lo is None or high is None else f" ({fmt(a)}–{fmt(b)})")
        tip = f"<title>{escape(label)}: {escape(shown)}</title>"
        body.append(f'<line x1="{x(a):.1f}" y1="{y}" x2="{x(b):.1f}" y2="{y}" stroke="{colour(i)}" '
                    f'stroke-width="3">{tip}</line>')  # fmt: skip
        for end in (a, b):
            body.append(
                f'<line x1="{x(end):.1f}" y1="{y - 5}" x2="{x(end):.1f}" y2="{y + 5}" stroke="{colour(i)}"/>'
            )
        body.append(f'<circle cx="{x(value):.1f}" cy="{y}" r="4.5" fill="{colour(i)}">{tip}</circle>')
        body.append(_text(x(b) + 6, y + 4, fmt(value)))
    axis_y = ROW_H * len(rows) + 12
    body.append(
        f'<line x1="{LABEL_W}" y1="{axis_y - 9}" x2="{LABEL_W + plot_w}" y2="{axis_y - 9}" class="axis"/>'
    )
    body.append(_text(LABEL_W, axis_y, fmt(0.0), "middle", "muted"))
    body.append(_text(LABEL_W + plot_w, axis_y, fmt(hi), "middle", "muted"))
    return _svg(WIDTH, axis_y + 4, body, title)
