"""OpenTelemetry spans of proxied requests, built after the fact from the log record and phase clock.

Nothing is traced while a request runs: when it ends, one ``SERVER`` span ("chat <requested
model>") is written with children ``routing`` (arrival → decision), ``queue`` (decision → upstream
call: concurrency and connection waits), ``upstream`` (the serving try, with ``first_token`` and
``last_token`` events) and ``delivery`` (last upstream byte → response end). The perf_counter
readings become wall-clock nanoseconds through the record's arrival time (``rec.ts`` is the
wall clock at ``phases.arrival``). The log's ``queue_ms`` is ``routing`` + ``queue``; the root
span also carries every phase as ``router.<column>`` so trace and log show the same numbers.

Attributes follow the OpenTelemetry GenAI conventions (``gen_ai.*``), OpenInference (what Arize
Phoenix displays: ``openinference.span.kind``, ``llm.*``, ``session.id``) and the router's own
(``router.*``). No prompt text unless the operator opted in twice: ``log_prompts`` captures it,
``trace_prompts`` puts it on the span.

A task is one trace. Every request of a task gets the trace id ``sha256("router-task:" +
task_id)[:16]``, so an agent's whole task opens as one waterfall in any trace UI, with no state
shared between requests or replicas (each computes the same id), and a trace-id-ratio sampler
keeps or drops whole tasks. Each request span is a root of that trace (it has no parent: an
invented parent would show as a missing span). Links were the alternative; most UIs show them
as a bare id, which does not make a task followable. The cost is that a very long task is a
very long trace; ``session.id`` / ``gen_ai.conversation.id`` carry the task id as well, for UIs
that group by session.

Configuration is the standard ``OTEL_*`` environment: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``..._TRACES_ENDPOINT``), headers, timeout, compression; ``OTEL_SERVICE_NAME`` /
``OTEL_RESOURCE_ATTRIBUTES``; ``OTEL_TRACES_SAMPLER``; ``OTEL_SDK_DISABLED``. Export is
OTLP/HTTP protobuf through a ``BatchSpanProcessor`` (off the request path).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from router.store.records import RequestRecord
from router.telemetry.phases import Phases

log = logging.getLogger("router.telemetry.tracing")

#: litellm provider prefix → ``gen_ai.provider.name`` (the GenAI conventions' well-known values).
GENAI_PROVIDERS = {
    "openai": "openai", "anthropic": "anthropic", "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference", "bedrock": "aws.bedrock", "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini", "mistral": "mistral_ai", "xai": "x_ai", "groq": "groq",
    "deepseek": "deepseek", "cohere": "cohere", "perplexity": "perplexity", "watsonx": "ibm.watsonx.ai",
}  # fmt: skip
#: litellm provider prefix → OpenInference ``llm.provider`` (who hosts the model).
OPENINFERENCE_PROVIDERS = {
    "openai": "openai", "anthropic": "anthropic", "azure": "azure", "azure_ai": "azure",
    "bedrock": "aws", "vertex_ai": "google", "gemini": "google", "mistral": "mistralai",
    "xai": "xai", "deepseek": "deepseek", "cohere": "cohere",
}  # fmt: skip
#: litellm provider prefix → OpenInference ``llm.system`` (whose API the model speaks).
OPENINFERENCE_SYSTEMS = {
    "openai": "openai", "azure": "openai", "anthropic": "anthropic", "vertex_ai": "vertexai",
    "gemini": "vertexai", "mistral": "mistralai", "cohere": "cohere",
}  # fmt: skip
PHASE_COLUMNS = ("queue_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "gap_p95_ms", "gap_max_ms",
                 "delivery_ms", "total_ms")  # fmt: skip


def otlp_configured(env: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for trace export."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def task_trace_id(task_id: str) -> int:
    """The trace id every request of a task shares."""
    digest = hashlib.sha256(b"router-task:" + task_id.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:16], "big") or 1  # 0 is the invalid trace id


class _TaskTraceIds(IdGenerator):
    """Random ids, except the trace id of a root span being built for a known task.

    The SDK asks the provider's id generator for a root span's trace id; there is no other
    way to choose it without inventing a parent span.
    """

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.next_trace_id: ContextVar[int | None] = ContextVar("router_next_trace_id", default=None)

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        chosen = self.next_trace_id.get()
        return chosen if chosen is not None else self._random.generate_trace_id()


class RequestTracer:
    def __init__(self, provider: TracerProvider, ids: _TaskTraceIds, *, prompts: bool = False) -> None:
        self.provider = provider
        self._ids = ids
        self._tracer = provider.get_tracer("router")
        self._prompts = prompts

    def record(self, rec: RequestRecord, phases: Phases) -> None:
        """Write the spans of one finished request."""
        base_ns = int(rec.ts * 1e9)

        def ns(t: float) -> int:
            return base_ns + int((t - phases.arrival) * 1e9)

        end = phases.done or phases.last_byte or phases.upstream_start or phases.decided or phases.arrival
        token = self._ids.next_trace_id.set(task_trace_id(rec.task_id) if rec.task_id else None)
        try:
            root = self._tracer.start_span(
                f"chat {rec.requested_model or 'unknown'}",
                context=otel_context.Context(),  # a root: never a child of whatever is current
                kind=SpanKind.SERVER,
                attributes=request_attributes(rec, prompts=self._prompts),
                start_time=ns(phases.arrival),
            )
        finally:
            self._ids.next_trace_id.reset(token)
        failed = (rec.status or 0) >= 400 or rec.error_type is not None
        if failed:
            root.set_status(Status(StatusCode.ERROR, rec.error_type or f"HTTP {rec.status}"))
        parent = trace.set_span_in_context(root)

        def child(name: str, start: float, stop: float, kind: SpanKind = SpanKind.INTERNAL) -> Span:
            return self._tracer.start_span(name, context=parent, kind=kind, start_time=ns(start))

        if phases.decided is not None:
            child("routing", phases.arrival, phases.decided).end(ns(phases.decided))
        if phases.upstream_start is not None:
            queued = phases.decided if phases.decided is not None else phases.arrival
            child("queue", queued, phases.upstream_start).end(ns(phases.upstream_start))
            up_end = phases.last_byte or phases.last_token or end
            up = child("upstream", phases.upstream_start, up_end, SpanKind.CLIENT)
            up.set_attributes(_upstream_attributes(rec))
            if phases.first_token is not None:
                up.add_event("first_token", timestamp=ns(phases.first_token))
            if phases.last_token is not None:
                up.add_event("last_token", timestamp=ns(phases.last_token))
            if failed and phases.last_byte is None:
                up.set_status(Status(StatusCode.ERROR, rec.error_type or f"HTTP {rec.status}"))
            up.end(ns(up_end))
        if phases.last_byte is not None and phases.done is not None:
            child("delivery", phases.last_byte, phases.done).end(ns(phases.done))
        root.end(ns(end))

    def shutdown(self) -> None:
        self.provider.shutdown()


def build_tracer(exporter: SpanExporter | None = None, *, prompts: bool = False) -> RequestTracer:
    """A tracer on a provider of its own (never the global one).

    ``exporter`` given (tests, an in-memory exporter): spans are exported synchronously as they
    end. Otherwise OTLP/HTTP configured by the ``OTEL_EXPORTER_OTLP_*`` variables, batched.
    """
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "router"}))
    ids = _TaskTraceIds()
    provider = TracerProvider(resource=resource, id_generator=ids)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("tracing: exporting spans over OTLP/HTTP")
    return RequestTracer(provider, ids, prompts=prompts)


def request_attributes(rec: RequestRecord, *, prompts: bool = False) -> dict[str, AttributeValue]:
    """The request span's attributes; absent values are left out, never written as guesses."""
    provider = rec.backend_model.split("/", 1)[0] if rec.backend_model and "/" in rec.backend_model else None
    served = rec.provider_model or _wire_model(rec.backend_model)
    tries = rec.tries or []
    tokens_total = (
        (rec.input_tokens or 0) + (rec.output_tokens or 0) if rec.input_tokens is not None else None
    )
    prompt_cost = _sum(rec.cost_input_usd, rec.cost_cache_read_usd, rec.cost_cache_write_usd)
    invocation = {k: v for k, v in {
        "temperature": rec.temperature, "top_p": rec.top_p, "max_tokens": rec.max_tokens,
        "reasoning_effort": rec.reasoning_effort, "thinking_budget": rec.thinking_budget, "stream": rec.stream,
    }.items() if v is not None}  # fmt: skip
    metadata = {"task_id": rec.task_id, "attempt": rec.attempt, "decision_id": rec.decision_id,
                "chosen_model": rec.chosen_model, "policy": rec.policy}  # fmt: skip
    attrs: dict[str, Any] = {
        # OpenTelemetry GenAI
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": GENAI_PROVIDERS.get(provider, provider) if provider else None,
        "gen_ai.system": GENAI_PROVIDERS.get(provider, provider) if provider else None,
        "gen_ai.request.model": rec.requested_model,
        "gen_ai.response.model": served,
        "gen_ai.request.temperature": rec.temperature,
        "gen_ai.request.top_p": rec.top_p,
        "gen_ai.request.max_tokens": rec.max_tokens,
        "gen_ai.request.stream": rec.stream,
        "gen_ai.usage.input_tokens": rec.input_tokens,
        "gen_ai.usage.output_tokens": rec.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": rec.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": rec.cache_write_tokens,
        "gen_ai.usage.reasoning.output_tokens": rec.reasoning_tokens,
        "gen_ai.conversation.id": rec.task_id,
        "gen_ai.response.time_to_first_chunk": rec.ttft_ms / 1000 if rec.ttft_ms is not None else None,
        "error.type": rec.error_type or (str(rec.status) if (rec.status or 0) >= 400 else None),
        "http.request.method": "POST",
        "http.response.status_code": rec.status,
        "url.path": rec.endpoint,
        # OpenInference (Arize Phoenix)
        "openinference.span.kind": "LLM",
        "llm.model_name": served,
        "llm.request.model_name": rec.requested_model,
        "llm.response.model_name": rec.provider_model,
        "llm.provider": OPENINFERENCE_PROVIDERS.get(provider, provider) if provider else None,
        "llm.system": OPENINFERENCE_SYSTEMS.get(provider, provider) if provider else None,
        "llm.invocation_parameters": orjson.dumps(invocation).decode(),
        "llm.token_count.prompt": rec.input_tokens,
        "llm.token_count.completion": rec.output_tokens,
        "llm.token_count.total": tokens_total,
        "llm.token_count.prompt_details.cache_read": rec.cache_read_tokens,
        "llm.token_count.prompt_details.cache_write": rec.cache_write_tokens,
        "llm.token_count.completion_details.reasoning": rec.reasoning_tokens,
        "llm.cost.total": rec.cost_usd,
        "llm.cost.prompt": prompt_cost,
        "llm.cost.completion": rec.cost_output_usd,
        "llm.cost.prompt_details.input": rec.cost_input_usd,
        "llm.cost.prompt_details.cache_read": rec.cost_cache_read_usd,
        "llm.cost.prompt_details.cache_write": rec.cost_cache_write_usd,
        "session.id": rec.task_id,
        "metadata": orjson.dumps(metadata).decode(),
        # the router's own
        "router.request_id": rec.request_id,
        "router.decision_id": rec.decision_id,
        "router.task_id": rec.task_id,
        "router.attempt": rec.attempt,
        "router.side_call": rec.side_call,
        "router.protocol": rec.protocol,
        "router.policy": rec.policy,
        "router.decision_reason": rec.decision_reason,
        "router.propensity": rec.propensity,
        "router.chosen_model": rec.chosen_model,
        "router.backend_model": rec.backend_model,
        "router.candidates": orjson.dumps(rec.candidates).decode() if rec.candidates else None,
        "router.candidate_models": [str(c.get("model")) for c in rec.candidates or []] or None,
        "router.fallbacks": [str(t.get("model")) for t in tries[:-1]] or None,
        "router.tries": len(tries) or None,
        "router.cost.predicted_usd": rec.cost_est_usd,
        "router.cost.actual_usd": rec.cost_usd,
        "router.usage_estimated": rec.usage_estimated,
        "router.prompt_tokens_est": rec.prompt_tokens_est,
    }
    for column in PHASE_COLUMNS:
        attrs[f"router.{column}"] = getattr(rec, column)
    if prompts and rec.prompt:
        attrs["input.value"] = rec.prompt
        attrs["input.mime_type"] = "application/json"
    return {k: v for k, v in attrs.items() if v is not None}


def _upstream_attributes(rec: RequestRecord) -> dict[str, AttributeValue]:
    attrs: dict[str, Any] = {
        "router.backend": rec.chosen_model,
        "gen_ai.response.model": rec.provider_model or _wire_model(rec.backend_model),
        "router.ttft_ms": rec.ttft_ms,
        "router.decode_ms": rec.decode_ms,
        "router.gap_mean_ms": rec.gap_mean_ms,
    }
    return {k: v for k, v in attrs.items() if v is not None}


def _wire_model(backend_model: str | None) -> str | None:
    return backend_model.split("/", 1)[1] if backend_model and "/" in backend_model else backend_model


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 10) if present else None
