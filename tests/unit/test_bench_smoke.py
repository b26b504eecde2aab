"""The benchmark harness keeps working: one tiny cell end to end, and its pure parts. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks import bodies, memory, routing
from benchmarks.loadgen import CellResult
from benchmarks.profile import parse_collapsed
from benchmarks.report import Row, percentile, table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_one_streamed_cell_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--no-litellm", "--no-pin", "--no-routing",
         "--scenarios", "chat-stream", "--concurrency", "1", "--duration", "0.3", "--warmup", "0.1",
         "--memory-requests", "0", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = orjson.loads(out.read_bytes())
    rows = {r["target"]: r for r in doc["rows"]}
    assert set(rows) == {"upstream", "floor", "router"}
    for row in rows.values():
        assert row["requests"] > 0 and row["errors"] == 0, row
        assert row["ttft_p50_ms"] is not None
    assert doc["memory"]["rss_after"] > 0
    assert "| chat-stream" in proc.stdout


@pytest.mark.integration
def test_the_memory_benchmark_runs_end_to_end() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", "--rounds", "2", "--per-round", "64", "--max-tasks", "50"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "MiB" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["0", "64", "128"]


def test_the_memory_benchmark_starts_a_new_task_with_a_real_issue_each_request() -> None:
    first, second = memory.issue_calls(2)
    a, b = orjson.loads(first.body.render(7, 7)), orjson.loads(first.body.render(8, 8))
    assert a["messages"][1] != b["messages"][1]  # another task
    assert a["messages"][1]["content"].startswith("Task 7:\n") and len(a["messages"][1]["content"]) > 200
    assert orjson.loads(second.body.render(9, 9))["messages"][1] != a["messages"][1]
    assert first.tasks > 10**12  # the request number is the task number: never reused


def test_templates_make_each_request_distinct_and_valid() -> None:
    t = bodies.template(bodies.chat_body("auto", stream=True))
    a, b = orjson.loads(t.render(3, 41)), orjson.loads(t.render(3, 42))
    assert a["messages"][1] == b["messages"][1]  # same task
    assert a["messages"][-1] != b["messages"][-1]  # distinct turn
    assert "Task 3:" in a["messages"][1]["content"]


def test_agent_body_is_coding_agent_sized() -> None:
    body = bodies.agent_chat_body("auto", stream=True)
    raw = bodies.template(body).render(0, 0)
    assert len(orjson.loads(raw)["messages"]) == 40
    assert 180_000 < len(raw) < 230_000


def test_routing_microbenchmark_times_every_stage() -> None:
    cases = routing.run(sizes=[1000], budget_s=0.0, max_iterations=4)
    first, nxt = cases
    assert (first.turn, nxt.turn) == ("first", "next")
    assert abs(first.tokens - 1000) <= 30
    assert all(len(first.samples[s]) == 2 for s in routing.STAGES)
    assert nxt.samples["task_vector"] == []  # computed once per task, not on the next turn
    assert "features p50/p99" in routing.render(cases)


def test_collapsed_stacks_drop_idle_pool_threads() -> None:
    raw = "\n".join(
        [
            "main (router/app/cli.py:1);handle (router/http/proxy.py:10);loads (json/decoder.py:5) 6",
            "main (router/app/cli.py:1);handle (router/http/proxy.py:10) 2",
            "_bootstrap (threading.py:1);_worker (concurrent/futures/thread.py:80) 50",
        ]
    )
    p = parse_collapsed(raw)
    assert (p.samples, p.idle) == (8, 50)
    assert p.self_time["loads (json/decoder.py)"] == 6
    assert p.inclusive["handle (router/http/proxy.py)"] == 8
    assert p.packages["json"] == 6 and p.packages["router"] == 2


def test_table_shows_added_latency_and_the_litellm_ratio() -> None:
    def row(target: str, requests: int, latency: float) -> Row:
        result = CellResult(requests=requests, window_s=1.0, latencies_ms=[latency] * 3)
        return Row("chat", 1, target, result)

    text = table([row("upstream", 1000, 0.5), row("router", 400, 1.5), row("litellm", 100, 10.0)])
    router_line = next(line for line in text.splitlines() if "| router" in line)
    assert "+1.00" in router_line and "4.0×" in router_line
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
