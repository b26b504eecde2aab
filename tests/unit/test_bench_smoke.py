"""The benchmark harness keeps working: one tiny cell end to end, and its pure parts. No timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks import bodies, memory, replay, routing
from benchmarks.cprofiles import where
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


@pytest.mark.integration
def test_the_cprofile_of_replayed_turns_runs_end_to_end(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile", "--cprofile", "--turns", "6", "--warmup", "2",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cprofile-replay.pstats").exists()
    assert "== replay: 6 turns at c=1" in proc.stdout
    # The request path's own modules are profiled (the event loop's thread), not only the start-up.
    assert "router/http/proxy.py" in proc.stdout and "router/policy/decide.py" in proc.stdout


def test_a_profiled_function_is_filed_under_its_module_or_package() -> None:
    assert where("~") == "C"
    assert where("/work/x/router/policy/decide.py") == "router/policy/decide.py"
    assert where("/work/x/.venv/lib/python3.11/site-packages/uvicorn/server.py") == "uvicorn"
    assert where("/usr/local/lib/python3.11/asyncio/events.py") == "asyncio"
    assert where("/usr/local/lib/python3.11/functools.py") == "functools"


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


@pytest.mark.parametrize("protocol", ["openai_chat", "anthropic"])
def test_a_replay_sends_each_real_run_turn_by_turn_as_a_tool_calling_agent(protocol: str) -> None:
    from router.protocols import WIRES

    runs = replay.load()[:3]
    played = replay.Replay(runs, "m", stream=True, anthropic=protocol == "anthropic")
    for run in runs:
        previous: list[object] = []
        for turn in range(len(run.steps)):
            req = WIRES[protocol].parse(played.next(0, len(played.sizes)))
            assert [t["name"] for t in _tool_names(req.tools)] == ["bash"]
            opening = 1 if protocol == "anthropic" else 2  # the task (after the system message in Chat)
            assert len(req.messages) == (len(previous) + 2 if turn else opening)
            assert req.messages[: len(previous)] == previous  # the conversation only grows
            previous = req.messages
        assert played.turns[-1] == len(run.steps)
    calls = [c for m in previous if isinstance(m, dict) for c in _commands(m)]
    assert calls and all(isinstance(c, str) and c for c in calls)


def _tool_names(tools: list[dict]) -> list[dict]:
    return [t.get("function", t) for t in tools]


def _commands(message: dict) -> list[str]:
    if "tool_calls" in message:
        return [orjson.loads(c["function"]["arguments"])["command"] for c in message["tool_calls"]]
    content = message.get("content")
    if isinstance(content, list):
        return [b["input"]["command"] for b in content if b.get("type") == "tool_use"]
    return []


def test_every_replay_is_its_own_task_and_slots_interleave_conversations() -> None:
    run = replay.load()[:1]
    played = replay.Replay(run, "m", stream=False, anthropic=False)
    first = orjson.loads(played.next(0, 100))["messages"][1]["content"]
    other = orjson.loads(played.next(1, 101))["messages"][1]["content"]
    assert first != other and first.startswith("[replay 100] ") and other.startswith("[replay 101] ")
    interleaved = replay.Replay(run, "m", stream=False, anthropic=False, slots=3)
    sizes = [len(orjson.loads(interleaved.next(0, n))["messages"]) for n in range(6)]
    assert sizes == [2, 2, 2, 4, 4, 4]  # three conversations, each advanced once per round


@pytest.mark.integration
def test_a_replay_cell_reports_bytes_turns_and_the_routers_conversation_memo(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--no-litellm", "--no-pin", "--no-routing", "--no-floor",
         "--scenarios", "replay", "--concurrency", "1", "--duration", "0.5", "--warmup", "0.1",
         "--memory-requests", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| replay" in proc.stdout
    memo = re.search(r"conversation memo hit rate ([\d.]+)% of (\d+) requests", proc.stdout)
    assert memo is not None, proc.stdout
    assert float(memo.group(1)) > 50 and int(memo.group(2)) > 0  # later turns extend earlier ones
    assert re.search(r"replay: [\d,]+ requests; body KB p10/p50/p90/max", proc.stdout)
