"""Spans built after the fact from a record and its phase clock, and the Prometheus metrics."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import prometheus_client
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from router.policy.loading import load_policy
from router.store.records import Estimate, RequestRecord, TryRecord
from router.telemetry import RouterTelemetry, Telemetry, build_telemetry
from router.telemetry.metrics import RequestMetrics
from router.telemetry.phases import Phases
from router.telemetry.report import quantile
from router.telemetry.tracing import (
    BackendInfo,
    backend_info_from,
    build_tracer,
    otlp_configured,
    task_trace_id,
)

TS = 1_700_000_000.0
MS = 1_000_000  # ns
MARKER = "PROMPT-MARKER-51c2"
LOCAL_POLICY = Path(__file__).resolve().parents[2] / "policies/examples/local.yaml"


def streamed(task: str = "task-a", request_id: str = "req-1") -> tuple[RequestRecord, Phases]:
    """A streamed request: routing 2 ms, queue 8 ms, TTFT 200 ms, decode 190 ms, delivery 4 ms."""
    p = Phases(arrival=100.0)
    p.decided, p.first_upstream_start = 100.002, 100.010
    p.upstream_start = p.first_upstream_start
    p.first_token, p.last_token, p.last_byte, p.done = 100.210, 100.400, 100.401, 100.405
    p.gaps = [0.010] * 19
    rec = RequestRecord(request_id=request_id, ts=TS, task_id=task, attempt=2, decision_id="dec-1")
    rec.protocol, rec.endpoint, rec.stream, rec.status = "openai_chat", "/v1/chat/completions", True, 200
    rec.requested_model, rec.chosen_model = "auto", "mini"
    rec.backend_model, rec.provider_model = "openai/gpt-mini", "gpt-mini-2025"
    rec.policy, rec.temperature, rec.max_tokens = "local-demo", 0.3, 512
    rec.candidates = [
        Estimate("nano", 1000, 50, 0, 0.001, excluded="context"),
        Estimate("mini", 1000, 50, 600, 0.002),
    ]
    rec.tries = [  # nano's breaker was open: skipped without a call, so mini served as a fallback
        TryRecord("nano", start_ms=None, ms=None, status=None, error_type="BreakerOpen"),
        TryRecord("mini", start_ms=10.0, ms=200.0, status=200, error_type=None),
    ]
    rec.response_id, rec.finish_reasons = "chatcmpl-1", ["stop"]
    rec.input_tokens, rec.output_tokens, rec.cache_read_tokens, rec.cache_write_tokens = 1000, 50, 600, 100
    rec.reasoning_tokens = 20
    rec.cost_usd, rec.cost_est_usd = 0.0021, 0.0025
    rec.cost_input_usd, rec.cost_output_usd = 0.0006, 0.001
    rec.cost_cache_read_usd, rec.cost_cache_write_usd = 0.0003, 0.0002
    rec.prompt = f'{{"messages": ["{MARKER}"]}}'
    for name, value in p.summary().items():
        setattr(rec, name, value)
    return rec, p


def spans_of(rec: RequestRecord, p: Phases, prompts: bool = False) -> dict[str, ReadableSpan]:
    exporter = InMemorySpanExporter()
    build_tracer(exporter, prompts=prompts).record(rec, p)
    return {s.name: s for s in exporter.get_finished_spans()}


def test_request_span_and_phase_children_carry_the_recorded_times() -> None:
    rec, p = streamed()
    spans = spans_of(rec, p)
    assert set(spans) == {"chat auto", "routing", "queue", "upstream", "delivery"}
    root = spans["chat auto"]
    assert root.kind is SpanKind.SERVER and root.parent is None
    start = int(TS * 1e9)
    assert root.start_time == start and root.end_time == start + 405 * MS

    def window(name: str) -> tuple[float, float]:
        s = spans[name]
        assert s.parent is not None and s.parent.span_id == root.context.span_id
        assert s.start_time is not None and s.end_time is not None
        return (s.start_time - start) / MS, (s.end_time - start) / MS

    assert window("routing") == pytest.approx((0, 2), abs=1e-3)
    assert window("queue") == pytest.approx((2, 10), abs=1e-3)
    assert window("upstream") == pytest.approx((10, 401), abs=1e-3)
    assert window("delivery") == pytest.approx((401, 405), abs=1e-3)
    assert spans["upstream"].kind is SpanKind.CLIENT
    events = {e.name: (e.timestamp - start) / MS for e in spans["upstream"].events}
    assert events == pytest.approx({"first_token": 210, "last_token": 400}, abs=1e-3)
    assert root.status.status_code is StatusCode.UNSET


def test_attributes_follow_genai_openinference_and_router_conventions() -> None:
    rec, p = streamed()
    attrs = dict(spans_of(rec, p)["chat auto"].attributes or {})
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "auto",
        "gen_ai.response.model": "gpt-mini-2025",
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.max_tokens": 512,
        "gen_ai.usage.input_tokens": 1000,
        "gen_ai.usage.output_tokens": 50,
        "gen_ai.usage.cache_read.input_tokens": 600,
        "gen_ai.usage.cache_creation.input_tokens": 100,
        "gen_ai.conversation.id": "task-a",
        "openinference.span.kind": "LLM",
        "llm.model_name": "gpt-mini-2025",
        "llm.provider": "openai",
        "llm.token_count.prompt": 1000,
        "llm.token_count.completion": 50,
        "llm.token_count.total": 1050,
        "llm.token_count.prompt_details.cache_read": 600,
        "llm.cost.total": 0.0021,
        "llm.cost.completion": 0.001,
        "session.id": "task-a",
        "router.decision_id": "dec-1",
        "router.task_id": "task-a",
        "router.attempt": 2,
        "router.chosen_model": "mini",
        "router.cost.predicted_usd": 0.0025,
        "router.cost.actual_usd": 0.0021,
        "router.ttft_ms": 200.0,
        "router.decode_ms": 190.0,
        "router.queue_ms": 10.0,
    }
    assert {k: attrs.get(k) for k in expected} == pytest.approx(expected)
    assert attrs["llm.cost.prompt"] == pytest.approx(0.0011)
    assert tuple(attrs["router.fallbacks"]) == ("nano",)  # type: ignore[arg-type]
    assert tuple(attrs["router.candidate_models"]) == ("nano", "mini")  # type: ignore[arg-type]
    assert '"excluded":"context"' in str(attrs["router.candidates"])
    assert '"temperature":0.3' in str(attrs["llm.invocation_parameters"])


def test_no_prompt_text_unless_the_operator_opts_in() -> None:
    rec, p = streamed()
    hidden = spans_of(rec, p)
    assert not any(MARKER in str(v) for s in hidden.values() for v in (s.attributes or {}).values())
    shown = spans_of(rec, p, prompts=True)["chat auto"].attributes or {}
    assert MARKER in str(shown["input.value"])


def test_a_task_is_one_trace_with_a_deterministic_id() -> None:
    exporter = InMemorySpanExporter()
    tracer = build_tracer(exporter)
    for task, rid in (("task-a", "r1"), ("task-a", "r2"), ("task-b", "r3")):
        tracer.record(*streamed(task, rid))
    roots = [s for s in exporter.get_finished_spans() if s.parent is None]
    ids = {str((s.attributes or {})["router.request_id"]): s.context.trace_id for s in roots}
    assert ids["r1"] == ids["r2"] == task_trace_id("task-a")
    assert ids["r3"] == task_trace_id("task-b") != ids["r1"]
    children = [s for s in exporter.get_finished_spans() if s.parent is not None]
    assert all(s.context.trace_id in (ids["r1"], ids["r3"]) for s in children)
    # A request with no task gets a trace of its own (random id).
    rec, p = streamed("", "r4")
    rec.task_id = None
    tracer.record(rec, p)
    assert exporter.get_finished_spans()[-1].context.trace_id not in (ids["r1"], ids["r3"])


def test_a_request_refused_before_routing_is_one_error_span() -> None:
    p = Phases(arrival=5.0)
    p.done = 5.001
    rec = RequestRecord(request_id="bad", ts=TS, protocol="openai_chat", status=400, error_type="BadRequest")
    rec.total_ms = 1.0
    spans = spans_of(rec, p)
    assert set(spans) == {"chat unknown"}
    root = spans["chat unknown"]
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["error.type"] == "BadRequest"


def test_non_streamed_reply_has_no_token_events() -> None:
    p = Phases(arrival=1.0)
    p.decided, p.first_upstream_start, p.upstream_start, p.last_byte, p.done = 1.001, 1.002, 1.002, 1.5, 1.502
    rec = RequestRecord(request_id="ns", ts=TS, requested_model="auto", status=200)
    spans = spans_of(rec, p)
    assert spans["upstream"].events == ()
    assert "router.ttft_ms" not in (spans["chat auto"].attributes or {})


def test_otlp_is_configured_only_by_the_standard_variables() -> None:
    assert not otlp_configured({})
    assert otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert otlp_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not otlp_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert build_telemetry(env={}).tracer is None
    with_otlp = build_telemetry(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert with_otlp.tracer is not None
    with_otlp.close()


def metrics_text(m: RequestMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(m.exposition().decode())
        for s in family.samples
    }


def test_metrics_count_phases_tokens_cost_and_fallbacks() -> None:
    m = RequestMetrics(process=False)
    m.route_of = lambda requested: "auto-route"
    rec, p = streamed()
    m.started(rec)
    m.finished(rec, p)
    rec2, p2 = streamed(request_id="req-2")
    rec2.tries, rec2.cache_read_tokens = None, 0
    m.started(rec2)
    m.finished(rec2, p2)
    v = metrics_text(m)

    def get(name: str, **labels: str) -> float:
        return v[(name, frozenset(labels.items()))]

    assert get("router_ttft_seconds_count", backend="mini") == 2
    assert get("router_ttft_seconds_sum", backend="mini") == pytest.approx(0.4)
    assert get("router_ttft_seconds_bucket", backend="mini", le="0.2") == 2
    assert get("router_ttft_seconds_bucket", backend="mini", le="0.15") == 0
    assert get("router_inter_token_gap_mean_seconds_sum", backend="mini") == pytest.approx(0.02)
    assert get("router_inter_token_gap_max_seconds_sum", backend="mini") == pytest.approx(0.02)
    assert get("router_queue_seconds_sum", backend="mini") == pytest.approx(0.02)
    assert get("router_routing_seconds_sum") == pytest.approx(0.004)
    assert get("router_request_duration_seconds_sum", backend="mini", status="200") == pytest.approx(0.81)
    assert get("router_decode_tokens_per_second_sum", backend="mini") == pytest.approx(2 * 50 / 0.19)
    assert get("router_requests_total", backend="mini", status="200") == 2
    assert get("router_tokens_total", backend="mini", kind="input") == 2000
    assert get("router_tokens_total", backend="mini", kind="cache_read") == 600
    assert get("router_tokens_total", backend="mini", kind="reasoning") == 40
    assert get("router_cost_usd_total", backend="mini", route="auto-route") == pytest.approx(0.0042)
    assert get("router_fallbacks_total", backend="mini") == 1  # nano's breaker was open
    assert not any(name == "router_retries_total" for name, _ in v)  # no backend was tried twice
    assert not any(name.endswith("_created") for name, _ in v)
    assert get("router_prompt_cache_hit_ratio", backend="mini") == pytest.approx(600 / 2000)
    assert get("router_inflight_requests") == 0


def test_in_flight_gauges_count_requests_and_streams() -> None:
    m = RequestMetrics(process=False)
    a, pa = streamed(request_id="a")
    b = RequestRecord(request_id="b", ts=TS)
    m.started(a)
    m.started(b)
    v = metrics_text(m)
    assert v[("router_inflight_requests", frozenset())] == 2
    assert v[("router_inflight_streams", frozenset())] == 1  # b has not asked to stream
    m.finished(a, pa)
    m.finished(a, pa)  # a second finish of the same request changes nothing
    assert metrics_text(m)[("router_inflight_requests", frozenset())] == 1


def test_each_app_has_its_own_registry() -> None:
    one, two = RequestMetrics(process=False), RequestMetrics(process=False)
    rec, p = streamed()
    one.finished(rec, p)
    assert ("router_requests_total", frozenset({("backend", "mini"), ("status", "200")})) in metrics_text(one)
    assert ("router_requests_total", frozenset({("backend", "mini"), ("status", "200")})) not in metrics_text(
        two
    )
    assert (
        prometheus_client.REGISTRY.get_sample_value(
            "router_requests_total", {"backend": "mini", "status": "200"}
        )
        is None
    )


def test_routes_are_labelled_by_the_policy_pattern_not_the_clients_string() -> None:
    t = build_telemetry(env={})
    policy = load_policy(LOCAL_POLICY)
    t.use_policy(lambda: policy)
    assert t.metrics.route_of("claude-sonnet-4-6-whatever") == "claude-*"
    assert t.metrics.route_of("auto") == "auto"
    assert t.metrics.route_of("no-such-model") == "none"
    assert t.metrics.route_of(None) == "none"


def test_telemetry_failures_never_reach_the_request() -> None:
    class Broken(RequestMetrics):
        def finished(self, rec: RequestRecord, phases: Phases) -> None:
            raise RuntimeError("bug in telemetry")

    t = RouterTelemetry(Broken(process=False))
    rec, p = streamed()
    t.started(rec)
    t.finished(rec, p)  # logged, not raised
    base = Telemetry()
    base.started(rec)
    base.finished(rec, p)
    assert base.exposition() is None


def retried_then_fell_back() -> tuple[RequestRecord, Phases]:
    """nano fails (10 → 60 ms), is retried after back-off and fails again (160 → 170 ms); mini serves
    from 200 ms: TTFT 100 ms, decode 100 ms."""
    rec, p = streamed()
    p.upstream_start, p.first_token, p.last_token, p.last_byte, p.done = 100.2, 100.3, 100.4, 100.401, 100.405
    p.gaps = [0.010] * 9 + [0.01001]
    rec.tries = [
        TryRecord("nano", start_ms=10.0, ms=50.0, status=500, error_type="UpstreamError"),
        TryRecord("nano", start_ms=160.0, ms=10.0, status=529, error_type="UpstreamOverloaded"),
        TryRecord("mini", start_ms=200.0, ms=100.0, status=200, error_type=None),
    ]
    for name, value in p.summary().items():
        setattr(rec, name, value)
    return rec, p


def test_failed_tries_and_back_off_are_the_retry_phase_not_queue() -> None:
    rec, p = retried_then_fell_back()
    assert (rec.queue_ms, rec.retry_ms, rec.ttft_ms, rec.decode_ms) == pytest.approx((10, 190, 100, 100))
    exporter = InMemorySpanExporter()
    tracer = build_tracer(exporter)
    tracer.backend_info = lambda backend: BackendInfo(f"openai/{backend}-model", f"{backend}.example", 443)
    tracer.record(rec, p)
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.parent is None)
    start = int(TS * 1e9)

    def window(s: ReadableSpan) -> tuple[float, float]:
        assert s.start_time is not None and s.end_time is not None
        return (s.start_time - start) / MS, (s.end_time - start) / MS

    by_name: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (queue,), (retry,) = by_name["queue"], by_name["retry"]
    assert window(queue) == pytest.approx((2, 10), abs=1e-3)
    assert window(retry) == pytest.approx((10, 200), abs=1e-3)
    failed = [
        s for s in by_name["upstream"] if s.parent is not None and s.parent.span_id == retry.context.span_id
    ]
    assert [window(s) for s in failed] == [
        pytest.approx((10, 60), abs=1e-3),
        pytest.approx((160, 170), abs=1e-3),
    ]
    for s, status in zip(failed, (500, 529), strict=True):
        attrs = s.attributes or {}
        assert s.kind is SpanKind.CLIENT and s.status.status_code is StatusCode.ERROR
        assert attrs["router.backend"] == "nano" and attrs["http.response.status_code"] == status
        assert attrs["server.address"] == "nano.example" and attrs["gen_ai.request.model"] == "nano-model"
    (served,) = [s for s in by_name["upstream"] if s not in failed]
    assert served.parent is not None and served.parent.span_id == root.context.span_id
    assert window(served) == pytest.approx((200, 401), abs=1e-3)
    attrs = served.attributes or {}
    assert (
        attrs["router.backend"] == "mini"
        and attrs["router.try"] == 3
        and attrs["server.address"] == "mini.example"
    )
    assert attrs["gen_ai.response.id"] == "chatcmpl-1" and tuple(attrs["gen_ai.response.finish_reasons"]) == (
        "stop",
    )  # type: ignore[arg-type]
    assert attrs["gen_ai.response.model"] == "gpt-mini-2025" and attrs["router.gap_max_ms"] == rec.gap_max_ms
    assert served.status.status_code is StatusCode.UNSET
    assert {(s.attributes or {})["openinference.span.kind"] for s in spans if s.parent is not None} == {
        "CHAIN"
    }
    root_attrs = root.attributes or {}
    assert root_attrs["openinference.span.kind"] == "LLM" and root_attrs["router.retry_ms"] == rec.retry_ms
    assert root_attrs["router.retries"] == 1 and tuple(root_attrs["router.fallbacks"]) == ("nano",)  # type: ignore[arg-type]

    m = RequestMetrics(process=False)
    m.finished(rec, p)
    v = metrics_text(m)
    assert v[("router_retry_seconds_sum", frozenset({("backend", "mini")}))] == pytest.approx(0.19)
    assert v[("router_queue_seconds_sum", frozenset({("backend", "mini")}))] == pytest.approx(0.01)
    assert v[("router_fallbacks_total", frozenset({("backend", "mini")}))] == 1
    # The first failure was retried on nano; the second sent the request on to mini.
    retries = {k: n for k, n in v.items() if k[0] == "router_retries_total"}
    assert retries == {
        ("router_retries_total", frozenset({("backend", "nano"), ("reason", "UpstreamError")})): 1
    }


def test_same_backend_retries_are_retries_not_fallbacks() -> None:
    rec, p = retried_then_fell_back()
    rec.tries = [replace(t, model="mini") for t in rec.tries or []]
    m = RequestMetrics(process=False)
    m.finished(rec, p)
    v = metrics_text(m)
    assert not any(name == "router_fallbacks_total" for name, _ in v)
    assert sum(n for (name, _), n in v.items() if name == "router_retries_total") == 2
    attrs = spans_of(rec, p)["chat auto"].attributes or {}
    assert "router.fallbacks" not in attrs and attrs["router.retries"] == 2


def test_a_failed_request_keeps_its_backend_on_the_span() -> None:
    p = Phases(arrival=1.0)
    p.decided, p.first_upstream_start, p.upstream_start, p.done = 1.001, 1.002, 1.002, 1.2
    rec = RequestRecord(request_id="f", ts=TS, requested_model="auto", status=502, error_type="UpstreamError")
    rec.chosen_model, rec.backend_model = "mini", "anthropic/claude-mini"
    rec.tries = [TryRecord("mini", start_ms=2.0, ms=150.0, status=502, error_type="UpstreamError")]
    spans = spans_of(rec, p)
    attrs = spans["chat auto"].attributes or {}
    assert attrs["gen_ai.provider.name"] == "anthropic" and attrs["gen_ai.response.model"] == "claude-mini"
    up = spans["upstream"]
    assert up.status.status_code is StatusCode.ERROR and (up.attributes or {})["router.backend"] == "mini"
    assert up.end_time is not None and up.start_time is not None
    assert (up.end_time - up.start_time) / MS == pytest.approx(150, abs=1e-3)  # the try, not the request


def test_a_stream_broken_after_its_first_token_fails_its_try_but_a_client_leaving_does_not() -> None:
    rec, p = streamed()
    rec.error_type = "UpstreamTimeout"  # the idle timeout fired mid-stream; the client had a 200
    assert spans_of(rec, p)["upstream"].status.status_code is StatusCode.ERROR
    rec.status, rec.error_type = 499, "client_disconnected"
    spans = spans_of(rec, p)
    assert spans["upstream"].status.status_code is StatusCode.UNSET
    assert spans["chat auto"].status.status_code is StatusCode.ERROR


def test_backend_info_names_the_host_each_try_called() -> None:
    info = backend_info_from(load_policy(LOCAL_POLICY).models)
    assert info("local-mini") == BackendInfo("openai/mini-model", "127.0.0.1", 9100)
    assert info("nope") is None
    hosted = backend_info_from(
        {"x": type("Spec", (), {"litellm_model": "anthropic/claude", "api_base": None})()}
    )
    assert hosted("x") == BackendInfo("anthropic/claude", "api.anthropic.com")


def test_phoenix_project_defaults_to_the_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def project() -> object:
        exporter = InMemorySpanExporter()
        build_tracer(exporter).record(*streamed())
        return exporter.get_finished_spans()[0].resource.attributes.get("openinference.project.name")

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert project() == "router"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "router-eu")
    assert project() == "router-eu"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "openinference.project.name=agents")
    assert project() == "agents"


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile`` over ``(le, cumulative count)`` pairs, +Inf last."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower  # Prometheus answers the highest finite bound
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    raise AssertionError("the +Inf bucket holds every observation")


def buckets_of(text: str, name: str, **labels: str) -> list[tuple[float, float]]:
    """One histogram child's ``(le, cumulative count)`` pairs from a text exposition."""
    out = [
        (float(s.labels["le"]), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == f"{name}_bucket" and {k: v for k, v in s.labels.items() if k != "le"} == labels
    ]
    return sorted(out)


@pytest.mark.parametrize(("median_s", "sigma"), [(0.15, 0.3), (0.4, 0.5), (1.0, 0.8), (3.0, 1.0)])
def test_prometheus_quantiles_agree_with_the_logs(median_s: float, sigma: float) -> None:
    """Spread latencies (log-normal, tens of ms to tens of s): histogram_quantile within 6% of the
    log's quantile (linear interpolation inside a bucket). The buckets before (0.1 → 0.25 → 0.5 s)
    were up to 48% off."""
    rng = random.Random(7)
    m = RequestMetrics(process=False)
    values = []
    for i in range(2000):
        rec = RequestRecord(request_id=f"q{i}", ts=TS, chosen_model="mini", status=200)
        rec.ttft_ms = round(rng.lognormvariate(math.log(median_s * 1000), sigma), 3)
        values.append(rec.ttft_ms)
        m.finished(rec, Phases(arrival=0.0))
    buckets = buckets_of(m.exposition().decode(), "router_ttft_seconds", backend="mini")
    for q in (0.5, 0.9, 0.99):
        exact = quantile(sorted(values), q)
        assert exact is not None
        assert histogram_quantile(q, buckets) * 1000 == pytest.approx(exact, rel=0.06), q
