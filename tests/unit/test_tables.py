"""The command line's tables at 80 columns: a table where it fits, else one block per row, and in
either form no id broken over lines and no cell cut (issue 20)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from router.app.cli import main
from router.store import open_store
from router.store.records import OutcomeRecord, RequestRecord, TryRecord
from router.telemetry import tables
from router.telemetry.ledger import usd

NOW = time.time()
#: Real provider ids are long; the task ids are the router's own (t- and 24 hex digits) and one
#: an agent chose, longer than the terminal.
BACKENDS = ("openrouter/anthropic/claude-sonnet-4.5", "deepseek/deepseek-v3.2-exp", "local-nano")
LONG_TASK = "acme/widgets#1234-fix-the-flaky-retry-test-in-the-payment-service-" + "x" * 30
TASKS = ("t-4afc33bcc506b5d8c70da63f", "t-e317e346b790c7d1eb753676", "t-181d1e2ac48022ff114c0229", LONG_TASK)


def _record(i: int, task: str) -> RequestRecord:
    backend, status = BACKENDS[i % 3], 200 if i % 4 else 502
    return RequestRecord(
        request_id=f"r{i}", ts=NOW - 300 + i, task_id=task, attempt=1, requested_model="auto",
        chosen_model=backend, status=status, stream=True, cost_usd=0.000123 * (i + 1), input_tokens=1200 * (i + 1),
        output_tokens=80, queue_ms=1.5, ttft_ms=120.0 + i, decode_ms=900.0, total_ms=1100.0 + i,
        policy_revision="rev-0123456789", arm=("control", "treated")[i % 2],
        tries=[TryRecord(backend, status=status)],
    )  # fmt: skip


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    records = [_record(i, task) for i, task in enumerate(TASKS * 3)]

    async def fill() -> None:
        store = open_store(url)
        await store.open()
        await store.write_requests(records)
        for i, task in enumerate(TASKS[:3]):
            await store.write_outcome(OutcomeRecord(task, 1, i != 1, None, "explicit", None, NOW - 10, True))
        await store.close()

    asyncio.run(fill())
    return url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def whole(out: str, values: list[str]) -> None:
    """Every value is on one line of ``out``, unbroken, and nothing was cut with an ellipsis."""
    lines = out.splitlines()
    for v in values:
        assert any(v in line for line in lines), f"{v!r} is broken or missing:\n{out}"
    assert "…" not in out, out


def narrow(out: str, allowed: tuple[str, ...] = ()) -> None:
    """No line of a table (or of a block of one) is wider than 80 columns, but one holding a value
    longer than that alone; the lines of prose around the tables stay whole, for grep."""
    table = [line for line in out.splitlines() if line.startswith(("  ", *"┏┃┡│├└")) or line in allowed]
    wide = [line for line in table if len(line) > 80 and not any(a in line for a in allowed)]
    assert not wide, "\n".join(wide)


@pytest.fixture
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.usefixtures("columns_80")
def test_tasks_at_80_columns(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "tasks", "--store", store_url, "--json"))
    out = run(capsys, "tasks", "--store", store_url)
    whole(out, [*TASKS, *BACKENDS])
    narrow(out, (LONG_TASK,))
    lines = out.splitlines()
    # Each id heads its block on a line of its own (easy to copy), and the block has its cells.
    starts = sorted(lines.index(task) for task in TASKS)
    for x in data["tasks"]:
        start = lines.index(x["task_id"])
        block = lines[start : next((i for i in starts if i > start), len(lines))]
        values = [usd(x["cost_usd"]["total"]), f"{x['duration_s']:.1f}s"]
        values += [f"{b} x{v['requests']}" for b, v in x["backends"].items()]
        o = x["outcome"]
        values.append("—" if o is None else f"{'done' if o['success'] else 'failed'} (explicit)")
        whole("\n".join(block), values)


@pytest.mark.usefixtures("columns_80")
def test_report_at_80_columns(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "report", "--store", store_url, "--json"))
    out = run(capsys, "report", "--store", store_url)
    values = list(BACKENDS)
    for g in data["groups"]:
        values += [f"reqs {g['requests']}", f"{g['error_rate'] * 100:.1f}%"]
        values.append(usd(g["cost_per_completed_task_usd"]) if g["cost_per_completed_task_usd"] else "n/a")
        # A group's spend was left to multiply out from $/req.
        assert re.search(rf"spend +{re.escape(usd(g['cost_usd']))} ", out), out
    whole(out, values)
    narrow(out)
    # Headers stay whole: no "com|ple|ted" or "$/d|one".
    whole(out, ["$/done task", "prefill tok/s", "decode tok/s", "fell back", "cached in"])


@pytest.mark.usefixtures("columns_80")
def test_report_by_arm_at_80_columns(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "report", "--by", "arm", "--store", store_url, "--json"))
    out = run(capsys, "report", "--by", "arm", "--store", store_url)
    [rev] = data["revisions"]
    values = []
    for s in rev["arms"].values():
        if s["success_rate"] is not None:
            lo, hi = s["success_ci95"]
            values += [f"{s['success_rate']:.1%}", f"({lo:.1%}-{hi:.1%})"]  # may wrap at the space
        if s["cost_per_completed_usd"] is not None:
            lo, hi = s["cost_per_completed_ci95"]
            values.append(f"(${lo:.6f}-${hi:.6f})")
    assert values, data
    whole(out, ["control", "treated", *values])
    narrow(out)


def _table(rows: list[tuple[str, ...]]) -> Table:
    t = Table("id", "count", "note", title="things")
    t.columns[1].justify = "right"
    for r in rows:
        t.add_row(*r)
    return t


def test_a_table_that_fits_is_a_table_and_one_that_does_not_is_blocks() -> None:
    rows = [
        ("t-4afc33bcc506b5d8c70da63f", "3", "short"),
        ("t-e317e346b790c7d1eb753676", "12", "a longer note"),
    ]
    wide = Console(width=120, record=True)
    tables.show(wide, _table(rows))
    shown = wide.export_text()
    assert "┃ id " in shown and "t-4afc33bcc506b5d8c70da63f" in shown

    slim = Console(width=40, record=True)
    assert not tables.fits(slim, _table(rows))
    tables.show(slim, _table(rows))
    assert slim.export_text().splitlines() == [
        "things",
        "t-4afc33bcc506b5d8c70da63f",
        "  count  3   note short",
        "t-e317e346b790c7d1eb753676",
        "  count 12   note a longer note",
    ]


def test_blocks_place_each_field_alike_in_every_block() -> None:
    t = Table("key", *(f"field{i}" for i in range(6)))
    t.add_row("first", *(str(10**i) for i in range(6)))
    t.add_row("second", *("x" for _ in range(6)))
    lines = tables.blocks(Console(width=40), t)
    first, second = lines[1 : lines.index("second")], lines[lines.index("second") + 1 :]
    assert len(first) == len(second) > 1  # wrapped, at the same fields
    for a, b in zip(first, second, strict=True):
        assert [w for w in a.split() if w.startswith("field")] == [
            w for w in b.split() if w.startswith("field")
        ]
        assert a.index("field") == b.index("field")
    assert all(len(line) <= 40 for line in lines)


def test_a_field_wider_than_the_terminal_stays_whole() -> None:
    t = Table("key", "what")
    long = "y" * 70
    t.add_row("k", long)
    assert tables.blocks(Console(width=40), t) == ["k", f"  what {long}"]


def test_dollars_are_decimals_with_four_significant_digits() -> None:
    # `router tasks --recent` and `router report` printed "$7.2e-06" and "$/req 1.127e-05".
    assert [usd(x) for x in (7.2e-06, 1.127e-05, 0.000360, 0.1307, 0.131121, 12.5, 1234.56, 0)] == [
        "0.0000072", "0.00001127", "0.00036", "0.1307", "0.1311", "12.5", "1235", "0",
    ]  # fmt: skip


def test_the_demos_table_of_routed_requests_cuts_nothing_at_80_columns() -> None:
    # `make demo` printed "local-claude (expl…" and "in/out toke…" at 80 columns (and when piped).
    from router.app.demo import routed_table

    table = routed_table()
    table.add_row("OpenAI, 40k-token prompt", "200", "local-claude (explored)", "43738/8", "178")
    table.add_row("Anthropic, streamed, thinking", "200", "local-claude", "(streamed)", "3")
    console = Console(width=80, record=True)
    tables.show(console, table)
    out = console.export_text()
    assert "…" not in out and "(explored)" in out and "tokens" in out, out
    narrow(out)


def test_tasks_say_one_task_in_the_singular(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "tasks", "--store", store_url, "--task", TASKS[0])
    assert "\n1 task: 1 completed, 0 failed, 0 without an outcome;" in out, out  # it said "1 tasks"
