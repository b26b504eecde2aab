"""Phase accounting end to end: the upstream's configured delays show up, with the same numbers, in
the log, the trace, /metrics, the task ledger and ``router report --json``.

The local upstream waits ``ttft_ms`` before the first of ``chunks`` content deltas and ``chunk_ms``
between them, so TTFT ≈ 200 ms, each gap ≈ 10 ms and decode ≈ 19 gaps ≈ 190 ms. Tolerances are
wide because the machine running the tests may be busy; timing only ever gets *later* under load,
so the lower bounds are the tight ones.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
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
from tests.integration.otlp import OtlpReceiver
from tests.unit.test_report import OUTCOMES, RECORDS
from tests.unit.test_telemetry import buckets_of, histogram_quantile

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
        s.telemetry = build_telemetry(trace_prompts=s.settings.trace_prompts, env={}, exporter=spans)

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

    def called(r: dict[str, Any]) -> float:  # wall-clock seconds of the upstream call
        return float(r["ts"]) + r["queue_ms"] / 1000

    rows = sorted((r for r in router.records(3) if r["chosen_model"] == "single"), key=called)
    assert len(rows) == 3
    assert rows[0]["queue_ms"] < 150
    # The only slot passes on once the stream holding it has ended: each later request waited in
    # the queue until the one ahead of it had its last token (however late it arrived itself).
    for ahead, behind in itertools.pairwise(rows):
        last_token = called(ahead) + (ahead["ttft_ms"] + ahead["decode_ms"]) / 1000
        assert called(behind) >= last_token - 0.001, rows
        assert behind["queue_ms"] >= (last_token - float(behind["ts"])) * 1000 - 1, rows
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


# A backend that fails its first call (then serves), one that always fails, and a steady one.
FLAKY = "openai/mini-model@fail_times=1,status=503,ttft_ms=60,chunk_ms=5,chunks=20"
BROKEN = "openai/mini-model@status=500"
STEADY = "openai/mini-model@ttft_ms=110,chunk_ms=5,chunks=20"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    """Requested before the router, so it outlives it: the router's last export finds it there."""
    with OtlpReceiver() as receiver:
        yield receiver


def failing_policy(upstream_url: str) -> dict[str, Any]:
    policy = local_policy(upstream_url)
    mini = next(m for m in policy["models"] if m["id"] == "local-mini")
    policy["models"] += [
        {**mini, "id": "flaky", "litellm_model": FLAKY},
        {**mini, "id": "broken", "litellm_model": BROKEN},
        {**mini, "id": "steady", "litellm_model": STEADY},
    ]
    policy["routes"] = [
        {"match": "flaky", "passthrough": "flaky"},  # alone: its failure is retried on it
        {"match": "fallback", "passthrough": "broken", "fallbacks": ["steady"]},
        {"match": "dead", "passthrough": "broken"},
        *policy["routes"],
    ]
    return policy


def test_retries_and_fallbacks_agree_across_log_trace_metrics_and_report(
    otlp: OtlpReceiver, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A retried stream, a stream that fell back and a request that failed, through a real server
    exporting over OTLP/HTTP to a receiver: queue, retry, TTFT and decode, the retry and fallback
    counts and the backend read the same in the log, the spans, /metrics and ``router report``."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    router = router_factory(failing_policy(upstream.url))
    stream(router, "flaky", "acct-retry")
    stream(router, "fallback", "acct-fallback")
    dead = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
        "model": "dead", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert dead.status_code == 502
    rows = {r["task_id"] if r["stream"] else "dead": r for r in router.records(3)}
    spans = otlp.wait_for(lambda got: sum(1 for s in got if not s.parent_span_id) >= 3)
    retried, fell_back, failed = rows["acct-retry"], rows["acct-fallback"], rows["dead"]
    for r in rows.values():
        r["tries"] = json.loads(r["tries"])

    # The log: each try in order, with the phases it explains.
    assert [(t["model"], t["status"]) for t in retried["tries"]] == [("flaky", 503), ("flaky", 200)]
    assert [(t["model"], t["status"]) for t in fell_back["tries"]] == [("broken", 500), ("steady", 200)]
    assert [(t["model"], t["status"]) for t in failed["tries"]] == [("broken", 500), ("broken", 500)]
    for r in rows.values():
        first, last = r["tries"][0], r["tries"][-1]
        assert r["queue_ms"] == pytest.approx(first["start_ms"], abs=0.002)
        assert r["retry_ms"] == pytest.approx(last["start_ms"] - first["start_ms"], abs=0.002)
        assert r["retry_ms"] >= first["ms"]  # the failed try is retry time, not queue time
    # The jittered back-off (0.25 s × 0.5..1.5) before retrying the only backend left.
    assert retried["retry_ms"] >= retried["tries"][0]["ms"] + 125
    assert failed["retry_ms"] >= failed["tries"][0]["ms"] + 125
    assert (retried["chosen_model"], fell_back["chosen_model"], failed["chosen_model"]) == (
        "flaky", "steady", "broken"
    )  # fmt: skip
    assert failed["backend_model"] == BROKEN and failed["status"] == 502
    assert retried["response_id"] and json.loads(retried["finish_reasons"]) == ["stop"]

    # The trace, as received over OTLP/HTTP.
    assert {s.resource.get("openinference.project.name") for s in spans} == {"router"}
    roots = {s.attributes["router.request_id"]: s for s in spans if not s.parent_span_id}
    for r in rows.values():
        root = roots[r["request_id"]]
        children = [s for s in spans if s.trace_id == root.trace_id and s.span_id != root.span_id]
        mine = {s.span_id for s in children if s.parent_span_id == root.span_id} | {root.span_id}
        kids = [s for s in children if s.parent_span_id in mine]  # this request's spans
        for column in ("queue_ms", "retry_ms", "ttft_ms", "decode_ms", "total_ms"):
            assert root.attributes.get(f"router.{column}") == r[column], column
        named = {s.name: s for s in kids if s.name != "upstream"}
        assert named["routing"].ms() + named["queue"].ms() == pytest.approx(r["queue_ms"], abs=0.01)
        assert named["retry"].ms() == pytest.approx(r["retry_ms"], abs=0.01)
        tries = sorted((s for s in kids if s.name == "upstream"), key=lambda s: s.start_ns)
        assert [s.kind for s in tries] == [3] * len(r["tries"])  # one CLIENT span per try
        for span, t in zip(tries, r["tries"], strict=True):
            assert span.attributes["router.backend"] == t["model"]
            assert span.attributes["http.response.status_code"] == t["status"]
            assert span.attributes["server.address"] == "127.0.0.1"
            assert (span.start_ns - root.start_ns) / 1e6 == pytest.approx(t["start_ms"], abs=0.01)
        failed_tries = tries if r is failed else tries[:-1]  # the failed request's last try failed too
        for span, t in zip(failed_tries, r["tries"], strict=False):
            assert span.ms() == pytest.approx(t["ms"], abs=0.01) and span.status_code == 2
        assert all(s.attributes["openinference.span.kind"] == "CHAIN" for s in kids)
        assert root.attributes["openinference.span.kind"] == "LLM"
        assert root.attributes.get("router.retries") == (1 if r is not fell_back else 0)
        assert root.attributes.get("router.fallbacks") == (("broken",) if r is fell_back else None)
        assert root.attributes["gen_ai.provider.name"] == "openai"
        assert root.attributes["gen_ai.response.model"] == (r["provider_model"] or BROKEN.split("/", 1)[1])
    served = sorted((s for s in spans if s.name == "upstream" and s.events), key=lambda s: s.start_ns)
    for span, r in zip(served, (retried, fell_back), strict=True):
        assert (span.events["first_token"] - span.start_ns) / 1e6 == pytest.approx(r["ttft_ms"], abs=0.01)
        assert (span.events["last_token"] - span.events["first_token"]) / 1e6 == pytest.approx(
            r["decode_ms"], abs=0.01
        )
        assert span.attributes["gen_ai.response.id"] == r["response_id"]
        assert span.attributes["gen_ai.response.finish_reasons"] == ("stop",)

    # /metrics: the same seconds, the same counts, no _created series.
    text = httpx.get(router.url + "/metrics", timeout=10).text
    m = metric_samples(router)
    assert "_created" not in text
    for r in rows.values():
        backend = r["chosen_model"]
        for metric, column in (("queue", "queue_ms"), ("retry", "retry_ms"), ("ttft", "ttft_ms"),
                               ("decode", "decode_ms")):  # fmt: skip
            if r[column] is not None:
                got = sample(m, f"router_{metric}_seconds_sum", backend=backend)
                assert got == pytest.approx(r[column] / 1000, abs=1e-6), (backend, metric)
    reason = retried["tries"][0]["error_type"]
    assert sample(m, "router_retries_total", backend="flaky", reason=reason) == 1
    assert sample(m, "router_retries_total", backend="broken", reason=failed["tries"][0]["error_type"]) == 1
    assert sample(m, "router_fallbacks_total", backend="steady") == 1
    assert not [k for k in m if k[0] == "router_fallbacks_total" and ("backend", "steady") not in k[1]]
    assert sample(m, "router_requests_total", backend="broken", status="502") == 1
    # One TTFT in its bucket: histogram_quantile reads within half the bucket (≤ 1/6 of the value).
    ttft = histogram_quantile(0.5, buckets_of(text, "router_ttft_seconds", backend="steady"))
    assert ttft * 1000 == pytest.approx(fell_back["ttft_ms"], rel=1 / 6)

    # The report, from the log.
    capsys.readouterr()
    assert main(["report", "--store", f"sqlite:///{router.db_path}", "--since", "1h", "--json"]) == 0
    groups = {g["key"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    assert (groups["flaky"]["retries"], groups["flaky"]["fallbacks"]) == (1, 0)
    assert (groups["steady"]["retries"], groups["steady"]["fallbacks"]) == (0, 1)
    assert (groups["broken"]["retries"], groups["broken"]["error_rate"]) == (1, 1.0)
    for key, r in (("flaky", retried), ("steady", fell_back)):
        for column in ("queue_ms", "retry_ms", "ttft_ms", "decode_ms"):
            assert groups[key]["phases_ms"][column]["p50"] == pytest.approx(r[column], abs=0.001), column
