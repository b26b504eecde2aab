"""``router report`` and the task ledger on a SQLite log filled with hand-made records."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from router.app.cli import main
from router.errors import ConfigError
from router.features.labels.model import SOURCE as LABEL_MODEL
from router.features.task.vector import task_vector, to_json
from router.learning.training import dataset
from router.rollout import arms
from router.rollout.arms import by_arm
from router.store import open_store
from router.store.records import OutcomeRecord, RequestRecord, TryRecord
from router.store.window import parse_duration
from router.telemetry.ledger import (
    UNANSWERED,
    final_outcome,
    load_task,
    render,
    render_recent,
    side_only,
    summary,
    task_ledger,
    task_ledgers,
    task_verdicts,
)
from router.telemetry.report import build_report, quantile
from router.ui.views import verdict_text

NOW = time.time()
BASE = NOW - 600


def rec(n: int, backend: str, task: str, **fields: Any) -> RequestRecord:
    r = RequestRecord(request_id=f"r{n}", ts=BASE + n, chosen_model=backend, task_id=task, attempt=1,
                      requested_model="auto", policy="p1", status=200, stream=True,
                      tries=[TryRecord(backend, status=200)])  # fmt: skip
    for k, v in fields.items():
        setattr(r, k, v)
    return r


def streamed(
    n: int, task: str, step: int, input_tokens: int, cached: int, temperature: float
) -> RequestRecord:
    """Backend alpha, phases scaled by ``step``: queue 10·s, ttft 100·s, decode 200·s, 5 + 5 ms to spare."""
    cost = 0.01 * step
    return rec(n, "alpha", task, queue_ms=10.0 * step, ttft_ms=100.0 * step, decode_ms=200.0 * step,
               delivery_ms=5.0, total_ms=310.0 * step + 10, input_tokens=input_tokens, cache_read_tokens=cached,
               output_tokens=100 * step, cost_usd=cost, cost_input_usd=cost * 0.5, cost_output_usd=cost * 0.4,
               cost_cache_read_usd=cost * 0.1, cost_cache_write_usd=0.0, temperature=temperature,
               gap_mean_ms=10.0)  # fmt: skip


FAILED_THEN_FELL_BACK = {"status": 502, "error_type": "UpstreamError", "queue_ms": 5.0, "total_ms": 100.0,
                         "tries": [TryRecord("alpha", status=500), TryRecord("beta", status=502)]}  # fmt: skip
NOT_STREAMED = {"stream": False, "queue_ms": 5.0, "delivery_ms": 2.0, "total_ms": 500.0, "input_tokens": 100,
                "output_tokens": 10, "cost_usd": 0.005}  # fmt: skip
RECORDS = [
    streamed(0, "T1", 1, 1000, 500, 0.2),
    streamed(1, "T1", 2, 1000, 0, 0.2),
    streamed(2, "T2", 3, 2000, 1000, 0.7),
    streamed(3, "T2", 4, 2000, 500, 0.2),
    rec(4, "beta", "T3", **FAILED_THEN_FELL_BACK),
    rec(5, "beta", "T3", **NOT_STREAMED),
]
OLD = rec(99, "alpha", "T-old", cost_usd=9.0, total_ms=100.0)
OLD.ts = NOW - 3 * 86400  # outside the default window of 24 h
OUTCOMES = [
    OutcomeRecord("T1", 1, True, 1.0, "explicit", None, NOW - 10, True),
    OutcomeRecord("T2", 1, False, None, "tests_failed", {"failed": 3}, NOW - 5, False),
]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'log.db'}"

    async def fill() -> None:
        store = open_store(url)
        await store.open()
        await store.write_requests([*RECORDS, OLD])
        for o in OUTCOMES:
            await store.write_outcome(o)
        await store.close()

    asyncio.run(fill())
    return url


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(list(argv)) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_report_by_backend(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "report", "--store", store_url, "--since", "1h", "--json")
    w = report["window"]
    assert w["requests"] == 6  # the two-hour-old request is outside the window
    assert w["seconds"] == pytest.approx(5.5)  # first arrival → last completion (r5: BASE + 5 + 0.5)
    assert w["rps"] == pytest.approx(6 / 5.5, rel=1e-3)
    total_s = (320 + 630 + 940 + 1250 + 100 + 500) / 1000
    assert w["concurrency"] == pytest.approx(total_s / 5.5, rel=1e-3)
    alpha, beta = report["groups"]
    assert (alpha["key"], beta["key"]) == ("alpha", "beta")
    assert alpha["requests"] == 4 and alpha["ok"] == 4
    assert alpha["load"]["rps"] == pytest.approx(4 / 5.5, rel=1e-3)
    ttft = alpha["phases_ms"]["ttft_ms"]
    assert (ttft["n"], ttft["p50"], ttft["p95"], ttft["p99"]) == (4, 250, 385, 397)
    alpha_total = 320 + 630 + 940 + 1250
    assert ttft["share"] == pytest.approx(1000 / alpha_total, abs=1e-4)
    assert alpha["phases_ms"]["decode_ms"]["share"] == pytest.approx(2000 / alpha_total, abs=1e-4)
    assert alpha["phases_ms"]["upstream_other_ms"]["p50"] == pytest.approx(5)
    shares = [alpha["phases_ms"][c]["share"] for c in ("queue_ms", "retry_ms", "ttft_ms", "decode_ms",
                                                       "upstream_other_ms", "delivery_ms")]  # fmt: skip
    assert sum(shares) == pytest.approx(1, abs=1e-3)
    assert alpha["decode_tok_s"]["p50"] == pytest.approx(500)
    assert alpha["prefill_tok_s"]["p50"] == pytest.approx((5000 + 20000 / 3) / 2, rel=1e-4)
    assert alpha["cached_input_share"] == pytest.approx(2000 / 6000, abs=1e-4)
    assert alpha["cost_per_request_usd"] == pytest.approx(0.1 / 4)
    # T1 completed, T2 failed: the one success cost what both tasks cost.
    assert alpha["tasks"] == {"count": 2, "with_outcome": 2, "completed": 1}
    assert alpha["cost_per_completed_task_usd"] == pytest.approx(0.1)
    assert alpha["settings_differ"] == {"temperature": {"0.2": 3, "0.7": 1}}
    assert alpha["error_rate"] == 0 and alpha["retry_rate"] == 0
    # r4 failed on alpha, then on beta: a fallback, not a retry (no backend was tried twice).
    assert beta["error_rate"] == 0.5 and beta["fallback_rate"] == 0.5 and beta["retry_rate"] == 0
    assert beta["ok"] == 1 and beta["phases_ms"]["ttft_ms"]["n"] == 0  # not streamed: no TTFT, no guess
    assert beta["phases_ms"]["upstream_other_ms"]["share"] == pytest.approx(493 / 500, abs=1e-3)
    assert beta["cost_per_completed_task_usd"] is None and beta["tasks"]["with_outcome"] == 0


def test_retry_is_its_own_part_and_retries_are_not_fallbacks() -> None:
    def row(n: int, tries: list[str], **phases: float | None) -> RequestRecord:
        attempts = [TryRecord(m, status=503) for m in tries[:-1]] + [TryRecord(tries[-1], status=200)]
        return RequestRecord(f"x{n}", BASE + n, chosen_model=tries[-1], status=200, tries=attempts,
                             delivery_ms=5.0, decode_ms=200.0, **phases)  # type: ignore[arg-type]  # fmt: skip

    rows = [
        row(0, ["a"], queue_ms=10.0, retry_ms=None, ttft_ms=100.0, total_ms=315.0),
        row(1, ["a", "a"], queue_ms=10.0, retry_ms=300.0, ttft_ms=100.0, total_ms=615.0),
        row(2, ["b", "a"], queue_ms=10.0, retry_ms=100.0, ttft_ms=100.0, total_ms=415.0),
        row(3, ["b", "a", "a"], queue_ms=10.0, retry_ms=500.0, ttft_ms=100.0, total_ms=815.0),
    ]
    (a,) = build_report(rows, [])["groups"]
    assert (a["retries"], a["retry_rate"], a["fallbacks"], a["fallback_rate"]) == (2, 0.5, 2, 0.5)
    retry = a["phases_ms"]["retry_ms"]
    assert (retry["n"], retry["p50"]) == (3, 300)  # the requests that retried or fell back
    assert retry["share"] == pytest.approx(900 / 2160, abs=1e-4)
    assert a["mean_parts_ms"]["retry"] == pytest.approx(225)
    assert a["phases_ms"]["upstream_other_ms"]["p50"] == 0  # the parts account for all of end to end


def test_report_by_task_and_route(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    by_task = run_json(capsys, "report", "--store", store_url, "--by", "task", "--json")
    groups = {g["key"]: g for g in by_task["groups"]}
    assert set(groups) == {"T1", "T2", "T3"}
    assert groups["T1"]["cost_per_completed_task_usd"] == pytest.approx(0.03)
    assert groups["T2"]["cost_per_completed_task_usd"] is None and groups["T2"]["tasks"]["with_outcome"] == 1
    by_route = run_json(capsys, "report", "--store", store_url, "--by", "route", "--json")
    assert [g["key"] for g in by_route["groups"]] == ["auto"]


def test_report_tables_and_plot(store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "report.png"
    assert main(["report", "--store", store_url, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "6 requests" in out and "alpha" in out and "temperature differs" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_log_axis_of_the_plot_labels_its_decades_only() -> None:
    # Decode times of 0.15-3.9 ms on a log axis: matplotlib labelled its minor ticks too, and
    # "2×10⁻¹ 3×10⁻¹ 4×10⁻¹ 6×10⁻¹" ran into one another under the boxes.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from router.app.commands.report import log_axis

    fig, ax = plt.subplots(figsize=(4, 2))
    try:
        ax.boxplot([[0.211, 0.248, 3.868], [0.152, 0.703]], orientation="horizontal")
        log_axis(ax)
        fig.canvas.draw()
        assert [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()] == []
        assert [t.get_text() for t in ax.get_xticklabels() if t.get_text()] == ["0.1", "1", "10"]
    finally:
        plt.close(fig)


def test_a_plot_that_cannot_be_written_is_one_line(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A FileNotFoundError from matplotlib's savefig, with its traceback, before.
    png = tmp_path / "no-such-dir" / "report.png"
    assert main(["report", "--store", store_url, "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"router report: --plot {png}: No such file or directory"), err
    assert err.count("\n") == 1


def test_a_plot_in_a_format_it_cannot_write_is_one_line_and_one_without_a_suffix_is_named(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot report.txt ended in matplotlib's ValueError and its traceback; --plot report wrote
    report.png and said "plot written to report"."""
    txt = tmp_path / "report.txt"
    assert main(["report", "--store", store_url, "--plot", str(txt)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"router report: --plot {txt}: Format 'txt' is not supported"), err
    assert err.count("\n") == 1 and not txt.exists()
    bare = tmp_path / "report"
    assert main(["report", "--store", store_url, "--plot", str(bare)]) == 0
    assert f"plot written to {bare}.png\n" in capsys.readouterr().out
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_task_ledger(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(capsys, "tasks", "--store", store_url, "--since", "1h", "--json")
    assert result["summary"] == {
        "tasks": 3, "with_outcome": 2, "completed": 1, "failed": 1, "without_outcome": 1,
        "side_only": {"tasks": 0, "cost_usd": 0}, "cost_usd": pytest.approx(0.105), "cost_of_judged_tasks_usd": pytest.approx(0.1),
        "cost_per_completed_task_usd": pytest.approx(0.1),
    }  # fmt: skip
    tasks = {t["task_id"]: t for t in result["tasks"]}
    t1 = tasks["T1"]
    assert t1["requests"] == 2 and t1["backends"] == {
        "alpha": {"requests": 2, "cost_usd": pytest.approx(0.03)}
    }
    assert t1["tokens"] == {"input": 2000, "output": 300, "cache_read": 500, "cache_write": 0, "reasoning": 0}
    assert t1["cost_usd"] == pytest.approx(
        {
            "total": 0.03,
            "input": 0.015,
            "output": 0.012,
            "cache_read": 0.003,
            "cache_write": 0,
            "tools": 0,
            "unsplit": 0,
        }
    )
    assert t1["outcome"]["success"] is True and t1["outcome"]["source"] == "explicit" and t1["completed"]
    assert tasks["T2"]["completed"] is False and tasks["T2"]["outcome"]["source"] == "tests_failed"
    t3 = tasks["T3"]
    assert t3["outcome"] is None and t3["errors"] == 1 and t3["fallbacks"] == 1 and t3["retries"] == 0
    assert t3["cost_usd"]["unsplit"] == pytest.approx(0.005)  # logged without the split
    only = run_json(capsys, "tasks", "--store", store_url, "--task", "T2", "--json")
    assert [t["task_id"] for t in only["tasks"]] == ["T2"]
    assert main(["tasks", "--store", store_url]) == 0
    assert "cost per completed task: $0.1" in capsys.readouterr().out


def test_load_task_from_the_store(store_url: str) -> None:
    async def load() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        store = open_store(store_url)
        await store.open()
        try:
            return await load_task(store, "T1"), await load_task(store, "nope")
        finally:
            await store.close()

    found, missing = asyncio.run(load())
    assert missing is None
    assert found is not None and found["requests"] == 2 and found["attempts"][0]["outcome"]["explicit"]


def test_explicit_outcome_overrides_inferred_signals() -> None:
    rows = [
        OutcomeRecord("t", 2, True, None, "tests_passed", None, 3.0, False),
        OutcomeRecord("t", 1, False, None, "explicit", None, 1.0, True),
    ]
    verdict = final_outcome(rows)
    assert verdict is not None and verdict["success"] is False and verdict["source"] == "explicit"
    assert final_outcome(rows[:1]) == {"success": True, "score": None, "source": "tests_passed",
                                       "explicit": False, "attempt": 2, "ts": 3.0}  # fmt: skip
    assert final_outcome([]) is None


def test_durations_and_quantiles() -> None:
    assert parse_duration("90s") == 90 and parse_duration("1h30m") == 5400 and parse_duration("2d") == 172800
    assert parse_duration("0.5h") == 1800
    for bad in ("", "10", "1x", "h1", "1h 2"):
        with pytest.raises(ConfigError):
            parse_duration(bad + ("q" if bad == "1h 2" else ""))
    assert quantile([], 0.5) is None
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.99) == 5.0


def test_missing_sqlite_log_is_an_error_not_a_new_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.db"
    assert main(["report", "--store", f"sqlite:///{missing}"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not missing.exists()


def test_train_reads_durations_as_report_does(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `router train --since 1w` once failed ("bad duration") while `router report --since 1w` worked.
    config = str(Path(__file__).resolve().parents[2] / "policies/examples/local.yaml")
    train = ["train", "--store", store_url, "--config", config, "--out", str(tmp_path / "a.json")]
    assert main(["report", "--store", store_url, "--since", "1w", "--json"]) == 0
    try:
        main([*train, "--since", "1w"])
    except ValueError as exc:  # the log is too small to fit: the duration was read
        assert "no labelled attempts" in str(exc)
    capsys.readouterr()
    assert main([*train, "--since", "1q"]) == 2
    assert "duration '1q'" in capsys.readouterr().err


def test_an_inferred_label_needs_an_attempt_a_backend_answered() -> None:
    # A trial: five "hi there" requests, each a 404, labelled a success at P=0.9997 by the label
    # model; the dashboard showed backend "(none)" with 1 completed task at $0.00. (Ended on a
    # request no backend answered, the task is a failure, "unanswered".)
    refused = [
        RequestRecord(f"h{i}", BASE + i, task_id="hi", attempt=1, status=404, error_type="UnknownModel",
                      chosen_model=None, arm="treated", cost_usd=None)
        for i in range(5)
    ]  # fmt: skip
    # Attempt 1 failed on every backend; attempt 2 was answered.
    retried = [
        RequestRecord("g1", BASE + 10, task_id="g", attempt=1, status=502, error_type="UpstreamError",
                      chosen_model="alpha", arm="treated", cost_usd=0.0),
        RequestRecord("g2", BASE + 20, task_id="g", attempt=2, status=200, chosen_model="alpha", arm="treated",
                      cost_usd=0.01),
    ]  # fmt: skip
    outcomes = [
        OutcomeRecord("hi", 1, True, 0.9997, LABEL_MODEL, None, BASE + 5, False),
        OutcomeRecord("g", 1, True, 0.9997, LABEL_MODEL, None, BASE + 11, False),
        OutcomeRecord("g", 2, False, 0.1, LABEL_MODEL, None, BASE + 9, False),
    ]
    requests = [*refused, *retried]
    hi, g = task_ledger("hi", refused, outcomes[:1]), task_ledger("g", retried, outcomes[1:])
    assert hi["outcome"]["source"] == UNANSWERED and hi["completed"] is False
    assert hi["attempts"][0]["outcome"] is None
    # Attempt 1's label was the latest, but only attempt 2 was answered: its failure is the verdict.
    assert g["completed"] is False and g["attempts"][0]["outcome"] is None
    assert summary(task_ledgers(requests, outcomes))["completed"] == 0
    groups = {x["key"]: x for x in build_report(requests, outcomes)["groups"]}
    assert groups["(none)"]["tasks"] == {"count": 1, "with_outcome": 1, "completed": 0}
    treated = by_arm(requests, outcomes)["treated"]
    assert treated.tasks == 2 and treated.success == [0.0, pytest.approx(0.1)]
    # What the client says counts, answered or not.
    said = OutcomeRecord("hi", 1, True, None, "explicit", None, BASE + 6, True)
    assert task_ledger("hi", refused, [*outcomes[:1], said])["completed"] is True


def test_tasks_for_a_task_not_in_the_log_says_so(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # It printed an empty table and exited 0.
    capsys.readouterr()
    assert main(["tasks", "--store", store_url, "--task", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"router tasks: no task 'nope' in {store_url} in the last 24h")
    assert main(["tasks", "--store", store_url, "--task", "T1", "--json"]) == 0


def test_an_attempt_that_ended_on_a_request_the_router_refused_has_no_inferred_verdict() -> None:
    # A new-user probe: tasks the budget (403 budget_exceeded), the stop-loss (400 attempt_stopped)
    # or a 429 ended were "done (outcome_model)" in `router tasks`, on the label read before. They
    # are failures, "unanswered" (and their spend counts in cost per completed task).
    def task(name: str, last: dict[str, Any]) -> list[RequestRecord]:
        served = [
            RequestRecord(f"{name}{i}", BASE + i, task_id=name, attempt=1, status=200, chosen_model="alpha",
                          arm="treated", cost_usd=0.01)
            for i in range(3)
        ]  # fmt: skip
        return [
            *served,
            RequestRecord(f"{name}-end", BASE + 3, task_id=name, attempt=1, arm="treated", **last),
        ]

    ended = {
        "budget": task("budget", {"status": 403, "error_type": "BudgetExceeded", "chosen_model": "alpha"}),
        "stopped": task("stopped", {"status": 400, "error_type": "AttemptStopped"}),
        "limited": task("limited", {"status": 429, "error_type": "RateLimited"}),
    }
    # A 429 the agent waited out and a side call refused after the last main-loop reply end nothing.
    waited = task("waited", {"status": 429, "error_type": "RateLimited"})
    waited.append(RequestRecord("waited-retry", BASE + 4, task_id="waited", attempt=1, status=200,
                                chosen_model="alpha", arm="treated", cost_usd=0.01))  # fmt: skip
    waited.append(RequestRecord("waited-side", BASE + 5, task_id="waited", attempt=1, status=403,
                                error_type="BudgetExceeded", side_call=True, arm="treated"))  # fmt: skip
    outcomes = [
        OutcomeRecord(name, 1, True, 0.915, LABEL_MODEL, None, BASE + 2.5, False)
        for name in [*ended, "waited"]
    ]
    requests = [r for rows in [*ended.values(), waited] for r in rows]
    for name, rows in ended.items():
        ledger = task_ledger(name, rows, outcomes)
        assert ledger["outcome"]["source"] == UNANSWERED and ledger["completed"] is False, name
    assert task_ledger("waited", waited, outcomes)["completed"] is True
    assert summary(task_ledgers(requests, outcomes))["completed"] == 1
    groups = {x["key"]: x for x in build_report(requests, outcomes)["groups"]}
    assert groups["alpha"]["tasks"] == {"count": 4, "with_outcome": 4, "completed": 1}
    assert by_arm(requests, outcomes)["treated"].success == [0.0, 0.0, 0.0, pytest.approx(0.915)]
    # What the client says counts still; training calls the refused attempts abandoned (failures).
    said = OutcomeRecord("budget", 1, True, None, "explicit", None, BASE + 6, True)
    assert task_ledger("budget", ended["budget"], [*outcomes, said])["completed"] is True
    vec = to_json(task_vector("x"))
    logged = [replace(r, task_features=vec) for r in requests]
    rows = {r.task_id: r for r in dataset.build(logged, outcomes, now=BASE + 5000, abandon_after_s=1000)}
    assert {t: (r.success, r.label_source) for t, r in rows.items()} == {
        "budget": (False, "abandoned"), "stopped": (False, "abandoned"), "limited": (False, "abandoned"),
        "waited": (True, LABEL_MODEL),
    }  # fmt: skip
    assert "budget" not in {
        r.task_id for r in dataset.build(logged, outcomes, now=BASE + 10, abandon_after_s=1000)
    }


def test_spend_on_a_task_the_router_refused_counts_in_cost_per_completed_task(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A task its budget stopped (a 403) after $0.03 of requests had no verdict ("—" in `router
    # tasks`), and its spend was left out of cost per completed task: a policy whose tasks ran into
    # their budgets looked the cheaper per completed task the more it spent on them.
    def task(name: str) -> list[RequestRecord]:
        return [
            RequestRecord(f"{name}{i}", BASE + i, task_id=name, attempt=1, status=200, chosen_model="alpha",
                          arm="treated", cost_usd=0.01)
            for i in range(3)
        ]  # fmt: skip

    done, refused = task("done"), task("refused")
    refused.append(RequestRecord("refused-end", BASE + 3, task_id="refused", attempt=1, status=403,
                                 error_type="BudgetExceeded", chosen_model="alpha", arm="treated"))  # fmt: skip
    outcomes = [OutcomeRecord("done", 1, True, None, "explicit", None, BASE + 4, True)]
    requests = done + refused
    ledgers = task_ledgers(requests, outcomes)
    s = summary(ledgers)
    assert (s["completed"], s["failed"], s["without_outcome"]) == (1, 1, 0)
    assert s["cost_per_completed_task_usd"] == pytest.approx(0.06)
    [group] = build_report(requests, outcomes)["groups"]
    assert group["cost_per_completed_task_usd"] == pytest.approx(0.06)
    treated = arms.summary(by_arm(requests, outcomes)["treated"])
    assert treated["cost_per_completed_usd"] == pytest.approx(0.06)
    render({"summary": s, "tasks": ledgers})
    out = capsys.readouterr().out
    assert "failed (unanswered)" in out and "1 completed, 1 failed, 0 without an outcome" in out


def test_the_arms_and_the_ledger_judge_each_task_alike() -> None:
    # The rollout arms kept their own copy of the ledger's verdict rule (credible outcomes, then
    # the latest, then a failure for a task that ended unanswered): a change to one would have let
    # the guard and `router tasks` judge the same task apart. Both read ledger.verdicts_in now.
    def req(n: int, task: str, attempt: int = 1, status: int = 200, **kw: Any) -> RequestRecord:
        return RequestRecord(f"{task}{n}", BASE + n, task_id=task, attempt=attempt, status=status,
                             chosen_model="alpha", arm=kw.pop("arm", "treated"), cost_usd=0.01,
                             error_type=None if status == 200 else "UpstreamError", **kw)  # fmt: skip

    requests = [
        req(0, "explicit"), req(1, "explicit", status=502),  # the client's word counts, answered or not
        req(2, "label"), req(3, "label"),  # a label of an answered attempt
        req(4, "refused"), req(5, "refused", status=403),  # a label read before the refusal
        req(6, "retried", status=502), req(7, "retried", attempt=2),  # attempt 1's label: not credible
        req(8, "waited", status=429), req(9, "waited"), req(10, "waited", status=403, side_call=True),
        req(11, "side", side_call=True), req(12, "side", status=403, side_call=True),  # no main loop
        req(13, "silent", arm="control"),  # answered, and nothing said of it
        req(14, "zero", arm="control"),  # an outcome of no attempt
        req(15, "failed", status=502, arm="control"), req(16, "failed", status=502, arm="control"),
    ]  # fmt: skip
    outcomes = [
        OutcomeRecord("explicit", 1, True, None, "explicit", None, BASE + 2, True),
        OutcomeRecord("label", 1, False, 0.3, LABEL_MODEL, None, BASE + 4, False),
        OutcomeRecord("refused", 1, True, 0.9, LABEL_MODEL, None, BASE + 4.5, False),
        OutcomeRecord("retried", 1, True, 0.9, LABEL_MODEL, None, BASE + 8, False),
        OutcomeRecord("waited", 1, True, 0.8, LABEL_MODEL, None, BASE + 11, False),
        OutcomeRecord("side", 1, True, 0.7, LABEL_MODEL, None, BASE + 13, False),
        OutcomeRecord("zero", 0, True, None, "tests_passed", None, BASE + 15, False),
        OutcomeRecord("elsewhere", 1, True, None, "explicit", None, BASE + 15, True),  # a task not logged
    ]
    ledgers = {x["task_id"]: x["outcome"] for x in task_ledgers(requests, outcomes)}
    verdicts = task_verdicts(requests, outcomes)
    judged = {t: (v.success, v.source) for t, v in verdicts.items() if t in ledgers}
    assert judged == {
        "explicit": (True, "explicit"), "label": (False, LABEL_MODEL), "refused": (False, UNANSWERED),
        "waited": (True, LABEL_MODEL), "zero": (True, "tests_passed"), "failed": (False, UNANSWERED),
    }  # fmt: skip
    assert {t: (o["success"], o["source"]) for t, o in ledgers.items() if o is not None} == judged
    # The arms' tally, read in two overlapping batches as the guard reads the log.
    tally = arms.TaskTally()
    tally.add(requests[:9])
    tally.add(requests[5:])
    assert tally.verdicts(outcomes) == {t: v for t, v in verdicts.items() if t in ledgers}
    by = tally.arms(outcomes)
    # A task of side calls alone awaits no verdict: counted as a task by neither.
    alone = side_only(requests, verdicts)
    assert alone == {"side"} and sum(x["side_only"] for x in task_ledgers(requests, outcomes)) == 1
    for arm in ("treated", "control"):
        tasks = [t for t in dict.fromkeys(r.task_id for r in requests if r.arm == arm) if t not in alone]
        counted = [t for t in tasks if t in verdicts]
        assert by[arm].tasks == len(tasks)
        assert by[arm].success == [arms.success_value(verdicts[t]) for t in counted], arm
        assert by[arm].cost == [pytest.approx(0.01 * sum(r.task_id == t for r in requests)) for t in counted]


def test_a_request_refused_before_any_attempt_ends_no_task() -> None:
    # `router demo --serve` shows its unknown-model example (a 404 before any routing: no decision,
    # no attempt) and the dashboard it opens said "0.0% success rate (0 of 1)": that 404 was the
    # only verdict on a fresh log, a failed task. A client's misnamed model is no attempt of a task.
    typo = [
        RequestRecord(f"x{i}", BASE + i, task_id="typo", attempt=None, status=404, error_type="UnknownModel",
                      chosen_model=None, cost_usd=None)
        for i in range(2)
    ]  # fmt: skip
    served = [
        RequestRecord("s1", BASE, task_id="s", attempt=1, status=200, chosen_model="alpha", cost_usd=0.01),
        RequestRecord("s2", BASE + 1, task_id="s", attempt=None, status=404, error_type="UnknownModel"),
    ]
    label = OutcomeRecord("s", 1, True, 0.9, LABEL_MODEL, None, BASE + 0.5, False)
    verdicts = task_verdicts([*typo, *served], [label])
    assert "typo" not in verdicts and verdicts["s"].success is True
    ledgers = task_ledgers([*typo, *served], [label])
    assert summary(ledgers)["tasks"] == 2 and [x["completed"] for x in ledgers if x["task_id"] == "typo"] == [
        None
    ]


def test_a_task_of_side_calls_alone_awaits_no_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    # opencode titles each session with a call of its own prompt, a task of its own (another hash)
    # that no label is ever read of: `router tasks` and the dashboard said "2 tasks (1 with a
    # verdict)" for one opencode run, the title "no verdict yet" forever.
    title = RequestRecord("t1", BASE, task_id="title", attempt=1, status=200, chosen_model="alpha",
                          side_call=True, cost_usd=0.001)  # fmt: skip
    run = [
        RequestRecord(f"m{i}", BASE + 1 + i, task_id="run", attempt=1, status=200, chosen_model="alpha",
                      side_call=i == 2, cost_usd=0.01)
        for i in range(3)
    ]  # fmt: skip
    label = OutcomeRecord("run", 1, True, 0.9, LABEL_MODEL, None, BASE + 4, False)
    requests = [title, *run]
    ledgers = task_ledgers(requests, [label])
    s = summary(ledgers)
    assert (s["tasks"], s["with_outcome"], s["without_outcome"]) == (1, 1, 0)
    assert s["side_only"] == {"tasks": 1, "cost_usd": pytest.approx(0.001)}
    assert s["cost_usd"] == pytest.approx(0.031)  # its spend is still spend
    assert [x["side_only"] for x in ledgers] == [False, True]  # listed, most recent first
    [group] = build_report(requests, [label])["groups"]
    assert group["tasks"] == {"count": 1, "with_outcome": 1, "completed": 1}
    render({"summary": s, "tasks": ledgers})
    out = capsys.readouterr().out
    assert "1 task: 1 completed, 0 failed, 0 without an outcome (and 1 of side calls alone" in out
    assert "side calls only" in out
    # An explicit outcome makes it a task like any other.
    said = OutcomeRecord("title", 1, False, None, "explicit", None, BASE + 5, True)
    s = summary(task_ledgers(requests, [label, said]))
    assert (s["tasks"], s["with_outcome"], s["side_only"]["tasks"]) == (2, 2, 0)


def test_a_clients_strings_are_printed_as_text_never_markup_or_control_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model a client asked for and its reasoning_effort are the log's, and any key may send
    them: '[/]' as one stopped `router report` (every --by) with rich's MarkupError for as long as the
    request was in the window, and a newline or an escape sequence reached the operator's terminal;
    '$…$' in a model stopped --plot with matplotlib's TeX parser."""
    url = f"sqlite:///{tmp_path / 'log.db'}"
    model = "[/bold]x[link=http://evil.example]y\n2026 INFO FORGED \x1b[31m$\\fracc{x$"
    records = [rec(0, "alpha", "T1"), rec(1, "alpha", "T2", requested_model=model, reasoning_effort="[/]")]

    async def fill() -> None:
        store = open_store(url)
        await store.open()
        await store.write_requests(records)
        await store.close()

    asyncio.run(fill())
    shown = {}
    for by in ("backend", "route"):
        capsys.readouterr()
        assert main(["report", "--store", url, "--by", by, "--plot", str(tmp_path / f"{by}.png")]) == 0
        shown[by] = out = capsys.readouterr().out
        assert "\x1b" not in out and "\n2026 INFO FORGED" not in out
    assert "alpha: reasoning_effort differs within the group: unset x1, [/] x1" in shown["backend"]
    out = shown["route"]
    assert "[/bold]x[link=http://evil.example]y\\n2026 INFO FORGED \\x1b[31m$\\fracc{x$" in out


def test_a_verdict_says_whether_the_client_sent_it_or_the_router_guessed_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A Claude Code session against the demo's fake provider, whose replies do nothing, was
    # "success (outcome_model)" in `router tasks --recent` and on /ui/tasks: the label model's guess
    # at P 0.98, in a name that said neither that it was a guess nor how sure.
    def task(name: str) -> RequestRecord:
        return RequestRecord(f"{name}1", BASE, task_id=name, attempt=1, status=200, chosen_model="alpha")

    outcomes = [
        OutcomeRecord("guessed", 1, True, 0.983963, LABEL_MODEL, None, BASE + 1, False),
        OutcomeRecord("signalled", 1, False, 0.2, "tests_failed", None, BASE + 1, False),
        OutcomeRecord("told", 1, False, None, "explicit", None, BASE + 1, True),
    ]
    ledgers = task_ledgers([task("guessed"), task("signalled"), task("told")], outcomes)
    render_recent(ledgers)
    said = {line.split()[0]: line.split("  ")[-1] for line in capsys.readouterr().out.splitlines()}
    assert said == {
        "guessed": "success (inferred, P(success) 0.98)",
        "signalled": "failure (inferred from tests_failed, P(success) 0.20)",
        "told": "failure (explicit)",
    }
    render({"summary": summary(ledgers), "tasks": ledgers})
    assert "done (inferred, P(success) 0.98)" in capsys.readouterr().out
    # The dashboard's task list and task page say it the same way.
    assert [verdict_text(x["outcome"]) for x in ledgers if x["task_id"] == "guessed"] == [
        "success (inferred, P(success) 0.98)"
    ]
