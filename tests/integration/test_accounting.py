"""Phase accounting end to end: the upstream's configured delays show up, with the same numbers, in
the log, the trace, /metrics, the task ledger and ``router report --json``.

The local upstream waits ``ttft_ms`` before the first of ``chunks`` content deltas and ``chunk_ms``
between them, so TTFT ≈ 200 ms, each gap ≈ 10 ms and decode ≈ 19 gaps ≈ 190 ms. Tolerances are
wide because the machine running the tests may be busy; timing only ever gets *later* under load,
so the lower bounds are the tight ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from router.app.cli import main
from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.store import open_store
from router.telemetry import build_telemetry
from tests.integration.conftest import RunningRouter, local_policy
from tests.unit.test_report import OUTCOMES, RECORDS

pytestmark = pytest.mark.integration

TIMED = "openai/mini-model@ttft_ms=200,chunk_ms=10,chunks=20"


def accounting_policy(upstream_url: str) -> dict[str, Any]:
    policy = local_policy(upstream_url)
    mini = next(m for m in policy["models"] if m["id"] == "local-mini")
    policy["models"] += [
        {**mini, "id": "timed", "litellm_model": TIMED},
        {**mini, "id": "single", "litellm_model": TIMED, "max_concurrency": 1},
    ]
    policy["routes"] = [
        {"match": "timed", "passthrough": "timed"},
        {"match": "single", "passthrough": "single"},
        *policy["routes"],
    ]
    return policy


@pytest.fixture
def traced(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> tuple[RunningRouter, InMemorySpanExporter]:
    upstream.clear()
    spans = InMemorySpanExporter()

    def hook(s: Services) -> None:
        s.telemetry = build_telemetry(s.settings, env={}, exporter=spans)

    return router_factory(accounting_policy(upstream.url), services_hook=hook), spans


def stream(router: RunningRouter, model: str, task: str) -> None:
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-x", max_retries=0, timeout=30)
    chunks = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "count to twenty"}], stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Router-Task-Id": task},
    )  # fmt: skip
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 20


def metric_samples(router: RunningRouter) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(router.url + "/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_configured_delays_show_up_everywhere_with_the_same_numbers(
    traced: tuple[RunningRouter, InMemorySpanExporter], capsys: pytest.CaptureFixture[str]
) -> None:
    router, spans = traced
    stream(router, "timed", "acct-task-1")
    rec = router.records(1)[-1]

    # The log: what the upstream was told to do.
    assert 140 <= rec["ttft_ms"] <= 260 + 200, rec  # 200 ms ± 60, plus slack above for a busy machine
    assert 5 <= rec["gap_mean_ms"] <= 15 + 15, rec  # 10 ms ± 5, plus slack above
    assert 130 <= rec["decode_ms"] <= 250 + 300, rec  # 19 gaps ≈ 190 ms ± 60, plus slack above
    assert rec["queue_ms"] < 100 and rec["delivery_ms"] < 50
    parts = rec["queue_ms"] + rec["ttft_ms"] + rec["decode_ms"] + rec["delivery_ms"]
    assert parts <= rec["total_ms"] + 0.01

    # The trace: one request span with routing/queue/upstream/delivery children, same numbers.
    by_name = {s.name: s for s in spans.get_finished_spans()}
    root = by_name["chat timed"]
    assert root.attributes is not None and root.attributes["router.request_id"] == rec["request_id"]
    for column in ("queue_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "delivery_ms", "total_ms"):
        assert root.attributes[f"router.{column}"] == rec[column], column
    upstream_span = by_name["upstream"]
    assert upstream_span.start_time is not None and upstream_span.parent is not None
    events = {e.name: e.timestamp for e in upstream_span.events}
    assert abs((events["first_token"] - upstream_span.start_time) / 1e6 - rec["ttft_ms"]) < 0.01
    assert abs((events["last_token"] - events["first_token"]) / 1e6 - rec["decode_ms"]) < 0.01
    routing, queue = by_name["routing"], by_name["queue"]
    assert routing.end_time is not None and routing.start_time is not None
    assert queue.end_time is not None and queue.start_time is not None
    assert abs((queue.end_time - routing.start_time) / 1e6 - rec["queue_ms"]) < 0.01
    assert root.attributes["gen_ai.usage.output_tokens"] == rec["output_tokens"]

    # /metrics: the one request on this backend, in seconds.
    m = metric_samples(router)
    assert sample(m, "router_ttft_seconds_count", backend="timed") == 1
    assert sample(m, "router_ttft_seconds_sum", backend="timed") == pytest.approx(rec["ttft_ms"] / 1000)
    assert sample(m, "router_decode_seconds_sum", backend="timed") == pytest.approx(rec["decode_ms"] / 1000)
    assert sample(m, "router_inter_token_gap_mean_seconds_sum", backend="timed") == pytest.approx(
        rec["gap_mean_ms"] / 1000
    )
    assert sample(m, "router_requests_total", backend="timed", status="200") == 1
    assert sample(m, "router_tokens_total", backend="timed", kind="output") == rec["output_tokens"]
    assert sample(m, "router_cost_usd_total", backend="timed", route="timed") == pytest.approx(
        rec["cost_usd"]
    )
    assert sample(m, "router_inflight_requests") == 0

    # The task ledger over HTTP.
    ledger = httpx.get(router.url + "/v1/tasks/acct-task-1", timeout=10).json()
    assert ledger["requests"] == 1 and ledger["backends"] == {
        "timed": {"requests": 1, "cost_usd": rec["cost_usd"]}
    }
    assert ledger["tokens"]["output"] == rec["output_tokens"]
    split = ledger["cost_usd"]
    assert split["input"] + split["output"] + split["cache_read"] + split["cache_write"] == pytest.approx(
        rec["cost_usd"]
    )
    missing = httpx.get(router.url + "/v1/tasks/no-such-task", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "task_not_found"

    # The report.
    capsys.readouterr()
    assert main(["report", "--store", f"sqlite:///{router.db_path}", "--since", "1h", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    group = next(g for g in report["groups"] if g["key"] == "timed")
    for column in ("queue_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "delivery_ms", "total_ms"):
        assert group["phases_ms"][column]["p50"] == pytest.approx(rec[column], abs=0.001), column
    assert group["decode_tok_s"]["p50"] == pytest.approx(
        rec["output_tokens"] / (rec["decode_ms"] / 1000), rel=1e-3
    )


def test_queue_wait_rises_behind_a_concurrency_limit(
    traced: tuple[RunningRouter, InMemorySpanExporter],
) -> None:
    router, _ = traced
    in_flight: list[float] = []
    done = threading.Event()

    def watch() -> None:
        # Scrape while the three streams run: they are in flight together, one at the upstream.
        while not done.is_set():
            in_flight.append(sample(metric_samples(router), "router_inflight_streams"))
            time.sleep(0.05)

    with ThreadPoolExecutor(4) as pool:
        watcher = pool.submit(watch)
        list(pool.map(lambda i: stream(router, "single", f"queue-task-{i}"), range(3)))
        done.set()
        watcher.result()
    rows = sorted(
        (r for r in router.records(3) if r["chosen_model"] == "single"), key=lambda r: r["queue_ms"]
    )
    assert len(rows) == 3
    first = rows[0]
    served_ms = first["ttft_ms"] + first["decode_ms"]  # how long the first one held the only slot
    assert first["queue_ms"] < 150
    # Each later request waited about as long as the ones ahead of it held the slot.
    assert rows[1]["queue_ms"] >= served_ms - 100, rows
    assert rows[2]["queue_ms"] >= rows[1]["queue_ms"] + served_ms - 100, rows
    assert max(in_flight) >= 2
    m = metric_samples(router)
    assert sample(m, "router_queue_seconds_count", backend="single") == 3
    assert sample(m, "router_queue_seconds_sum", backend="single") == pytest.approx(
        sum(r["queue_ms"] for r in rows) / 1000, rel=1e-3
    )
    assert sample(m, "router_inflight_streams") == 0


PG_URL = os.environ.get("ROUTER_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")


def test_report_and_ledger_read_the_same_from_postgresql_and_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = f"router_acct_{uuid.uuid4().hex[:12]}"
    pg = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    lite = f"sqlite:///{tmp_path / 'log.db'}"

    async def admin(sql: str) -> None:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
            await conn.execute(sql)

    async def fill(url: str) -> None:
        store = open_store(url)
        await store.open()
        await store.write_requests(RECORDS)
        for o in OUTCOMES:
            await store.write_outcome(o)
        await store.close()

    asyncio.run(admin(f"CREATE SCHEMA {schema}"))
    try:
        asyncio.run(fill(pg))
        asyncio.run(fill(lite))
        out = {}
        for name, url in (("pg", pg), ("sqlite", lite)):
            capsys.readouterr()
            assert main(["report", "--store", url, "--json"]) == 0
            report = json.loads(capsys.readouterr().out)
            assert main(["tasks", "--store", url, "--json"]) == 0
            tasks = json.loads(capsys.readouterr().out)
            out[name] = (report["window"], report["groups"], tasks["summary"], tasks["tasks"])
        assert out["pg"] == out["sqlite"]
        assert out["pg"][0]["requests"] == len(RECORDS)
    finally:
        asyncio.run(admin(f"DROP SCHEMA {schema} CASCADE"))
