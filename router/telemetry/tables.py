"""The command line's tables at any terminal width: a table where it fits, else one block per row.

Rich squeezes a table wider than the terminal by folding columns below their longest word (a
task id over five lines, "com|ple|ted") or cutting them with "…". Here a table is printed only
when every column gets at least its longest word, so rich wraps at spaces alone; otherwise each
row becomes a block: its first cell whole on a line of its own, then "header value" fields, at
the same places in every block so that they still compare down the page. Neither form folds or
cuts a cell; a field wider than the terminal wraps at its spaces, and a word wider than that
stays whole for the terminal to wrap.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from router.telemetry.console import printable

INDENT = "  "
GAP = "   "
#: Wide enough that rich measures each column at its natural size, never at the terminal's.
_UNBOUNDED = 1_000_000


def literal(text: str) -> Text:
    """``text`` as a cell or a line shows it: never read as rich's markup, its control characters
    escaped. What the log keeps of a client (the model it asked for, its ``reasoning_effort``) is
    printed by the commands: ``[/]`` in one stopped ``router report`` with a ``MarkupError`` for the
    whole window, ``[link=…]`` made a link, and a newline or an escape sequence reached the
    operator's terminal."""
    return Text(printable(text))


def fits(console: Console, table: Table) -> bool:
    """Whether every column of ``table`` can have its longest word within the console's width."""
    return _measure(console, table).minimum <= console.width


def _measure(console: Console, table: Table) -> Measurement:
    return Measurement.get(console, console.options.update(max_width=_UNBOUNDED), table)


def show(console: Console, table: Table) -> None:
    """Print ``table`` as a table if it fits the console (``fits``), else as blocks."""
    if fits(console, table):
        _settle_widths(console, table)
        console.print(table)
        return
    if table.title:
        console.print(table.title, style="bold", soft_wrap=True)
    for line in blocks(console, table):
        heading = not line.startswith(INDENT)
        console.print(Text(line, style="bold" if heading else ""), soft_wrap=True, highlight=False)


def _settle_widths(console: Console, table: Table) -> None:
    """Fix the widths of a table too wide for the console at its natural size: each column gets
    its longest word and a share of the room left in proportion to what more it could use.
    (Rich itself narrows the widest columns first, below their longest word if need be.)"""
    whole = _measure(console, table)
    if whole.maximum <= console.width:
        return
    options = console.options.update(max_width=_UNBOUNDED)
    ranges = []
    for column in table.columns:
        sizes = [Measurement.get(console, options, c) for c in (column.header, *column.cells)]
        ranges.append((max(m.minimum for m in sizes), max(m.maximum for m in sizes)))
    overhead = whole.minimum - sum(lo for lo, _ in ranges)  # padding and borders
    spare = console.width - overhead - sum(lo for lo, _ in ranges)
    wants = [hi - lo for lo, hi in ranges]
    total = sum(wants) or 1
    shares = [spare * w // total for w in wants]
    for i in sorted(range(len(wants)), key=lambda i: -wants[i])[: spare - sum(shares)]:
        shares[i] += 1  # what the rounding down left, to the columns that want most
    for column, (lo, hi), share in zip(table.columns, ranges, shares, strict=True):
        column.width = min(hi, lo + share)


def _plain(console: Console, cell: RenderableType | None) -> str:
    if cell is None:
        return ""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return console.render_str(cell).plain  # the markup a table would render
    return str(cell)


def blocks(console: Console, table: Table) -> list[str]:
    """The lines of ``table`` as one block per row, for ``console``'s width (see the module)."""
    columns = table.columns
    cells = [[_plain(console, c) for c in col.cells] for col in columns]
    headers = [_plain(console, col.header) for col in columns]
    n_rows = max((len(c) for c in cells), default=0)
    value_w = [max((len(v) for v in col), default=0) for col in cells]
    fields = range(1, len(columns))
    field_w = {j: len(headers[j]) + 1 + value_w[j] for j in fields}
    # Line breaks are chosen once for all rows: a field sits at the same place in every block.
    layout: list[list[int]] = [[]]
    used = len(INDENT)
    room = max(console.width, 20)
    for j in fields:
        extra = field_w[j] + (len(GAP) if layout[-1] else 0)
        if layout[-1] and used + extra > room:
            layout.append([])
            used, extra = len(INDENT), field_w[j]
        layout[-1].append(j)
        used += extra
    lines = []
    for i in range(n_rows):
        heading = cells[0][i] if columns and i < len(cells[0]) else ""
        if heading:
            lines.append(heading)
        for group in layout:
            parts = []
            for j in group:
                value = cells[j][i] if i < len(cells[j]) else ""
                value = value.rjust(value_w[j]) if columns[j].justify == "right" else value.ljust(value_w[j])
                parts.append(f"{headers[j]} {value}")
            if len(parts) == 1 and len(INDENT) + len(parts[0].rstrip()) > room:
                # A field alone on its line and still too wide wraps at its spaces, under its value.
                lines += _wrap(headers[group[0]], parts[0][len(headers[group[0]]) + 1 :].strip(), room)
            elif parts:
                lines.append((INDENT + GAP.join(parts)).rstrip())
    return lines


def _wrap(header: str, value: str, room: int) -> list[str]:
    """``header value`` over lines of ``room`` columns, the value's lines under its start, broken
    after the commas of a list (``a x1, b x2``) or else at spaces; a piece too long for any line
    keeps one of its own."""
    hang = " " * (len(INDENT) + len(header) + 1)
    sep = ", " if ", " in value else " "
    pieces = [p + sep.rstrip() for p in value.split(sep)]
    pieces[-1] = pieces[-1].removesuffix(sep.rstrip())
    lines = [f"{INDENT}{header} {pieces[0]}"]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) <= room:
            lines[-1] += f" {piece}"
        else:
            lines.append(hang + piece)
    return lines
