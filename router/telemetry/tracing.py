"""OpenTelemetry spans of proxied requests, built after the fact from the log record and phase clock.

Nothing is traced while a request runs: when it ends, one ``SERVER`` span ("chat <requested
model>") is written with children, each a phase of the log's record:

* ``routing`` (arrival → decision) and ``queue`` (decision → the first try's upstream call:
  concurrency waits); the log's ``queue_ms`` is ``routing`` + ``queue``;
* ``retry`` (the first try's upstream call → the last try's), only when a try failed and another
  followed: it holds one ``CLIENT`` span per failed try, the gaps between them are back-off;
* ``upstream``: the last try (the one that served, or failed last), a ``CLIENT`` span with
  ``first_token`` and ``last_token`` events;
* ``delivery`` (last upstream byte → response end).

Every try span names its backend, status and timings. The perf_counter readings become wall-clock
nanoseconds through the record's arrival time (``rec.ts`` is the wall clock at
``phases.arrival``); the root span also carries every phase as ``router.<column>`` so trace and
log show the same numbers.

Attributes follow the OpenTelemetry GenAI conventions (``gen_ai.*``), OpenInference (what Arize
Phoenix displays: ``openinference.span.kind``, ``llm.*``, ``session.id``) and the router's own
(``router.*``). The request span is the one OpenInference ``LLM`` span of a request (it carries
the tokens and cost, so Phoenix counts each request once); its children are ``CHAIN`` steps.
No prompt text unless the operator opted in twice: ``log_prompts`` captures it, ``trace_prompts``
puts it on the span.

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
``OTEL_RESOURCE_ATTRIBUTES``; ``OTEL_TRACES_SAMPLER``; ``OTEL_SDK_DISABLED``. The resource's
``openinference.project.name`` (Phoenix's project) defaults to the service name. Export is
OTLP/HTTP protobuf through a ``BatchSpanProcessor`` (off the request path).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from router.store.records import RequestRecord, TryRecord
from router.telemetry import tries as tries_
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
PHASE_COLUMNS = ("queue_ms", "retry_ms", "ttft_ms", "decode_ms", "gap_mean_ms", "gap_p95_ms", "gap_max_ms",
                 "delivery_ms", "total_ms")  # fmt: skip


#: litellm provider prefix → the API host litellm calls when a backend sets no ``api_base``.
DEFAULT_HOSTS = {
    "openai": "api.openai.com", "anthropic": "api.anthropic.com", "mistral": "api.mistral.ai",
    "groq": "api.groq.com", "deepseek": "api.deepseek.com", "xai": "api.x.ai",
    "gemini": "generativelanguage.googleapis.com", "cohere": "api.cohere.ai",
}  # fmt: skip
PROJECT_ATTRIBUTE = "openinference.project.name"


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a try span says about the backend it called (looked up by catalog id)."""

    litellm_model: str
    server_address: str | None = None
    server_port: int | None = None


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
        #: catalog id → the backend's model and host; the app points it at the policy in force.
        self.backend_info: Callable[[str], BackendInfo | None] = lambda _id: None

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

        def child(name: str, start: float, kind: SpanKind = SpanKind.INTERNAL,
                  under: otel_context.Context = parent) -> Span:  # fmt: skip
            span = self._tracer.start_span(name, context=under, kind=kind, start_time=ns(start))
            span.set_attribute("openinference.span.kind", "CHAIN")
            return span

        if phases.decided is not None:
            child("routing", phases.arrival).end(ns(phases.decided))
        first, last = phases.first_upstream_start, phases.upstream_start
        if first is not None and last is not None:
            queued = phases.decided if phases.decided is not None else phases.arrival
            child("queue", queued).end(ns(first))
            reached = [(i, t) for i, t in enumerate(rec.tries or [], 1) if t.start_ms is not None]
            if last != first:
                retry = child("retry", first)
                under = trace.set_span_in_context(retry, parent)
                for i, t in reached[:-1]:
                    start = phases.arrival + (t.start_ms or 0.0) / 1000
                    stop = start + (t.ms or 0.0) / 1000
                    up = child("upstream", start, SpanKind.CLIENT, under)
                    up.set_attributes(self._try_attributes(i, t))
                    up.set_status(Status(StatusCode.ERROR, tries_.reason(t)))
                    up.end(ns(stop))
                retry.end(ns(last))
            # A record without tries (written by hand) still gets its one upstream span.
            final = reached[-1] if reached else (1, TryRecord(rec.chosen_model or ""))
            up_end = phases.last_byte or phases.last_token or end
            if failed and phases.first_token is None and (ms := final[1].ms) is not None:
                up_end = last + ms / 1000  # the try failed: its span ends with it
            up = child("upstream", last, SpanKind.CLIENT)
            up.set_attributes(self._try_attributes(*final))
            up.set_attributes(_serving_attributes(rec))
            if phases.first_token is not None:
                up.add_event("first_token", timestamp=ns(phases.first_token))
            if phases.last_token is not None:
                up.add_event("last_token", timestamp=ns(phases.last_token))
            if failed and rec.error_type != "client_disconnected":  # a client leaving is no fault of the try
                up.set_status(Status(StatusCode.ERROR, rec.error_type or f"HTTP {rec.status}"))
            up.end(ns(up_end))
        if phases.last_byte is not None and phases.done is not None:
            child("delivery", phases.last_byte).end(ns(phases.done))
        root.end(ns(end))

    def _try_attributes(self, number: int, t: TryRecord) -> dict[str, AttributeValue]:
        backend = t.model or None
        info = self.backend_info(backend) if backend is not None else None
        provider = info.litellm_model.split("/", 1)[0] if info and "/" in info.litellm_model else None
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": GENAI_PROVIDERS.get(provider, provider) if provider else None,
            "gen_ai.request.model": _wire_model(info.litellm_model) if info else None,
            "server.address": info.server_address if info else None,
            "server.port": info.server_port if info else None,
            "http.response.status_code": t.status,
            "error.type": t.error_type,
            "router.backend": backend,
            "router.try": number,
            "router.try_ms": t.ms,
        }
        return {k: v for k, v in attrs.items() if v is not None}

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
    if PROJECT_ATTRIBUTE not in resource.attributes:
        # Phoenix files spans by this attribute, not service.name: without it all land in "default".
        resource = resource.merge(Resource({PROJECT_ATTRIBUTE: resource.attributes["service.name"]}))
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
        "gen_ai.response.id": rec.response_id,
        "gen_ai.response.finish_reasons": rec.finish_reasons or None,
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
        "router.candidates": orjson.dumps([c.as_json() for c in rec.candidates]).decode()
        if rec.candidates
        else None,
        "router.candidate_models": [c.model for c in rec.candidates or []] or None,
        "router.fallbacks": tries_.fallen_back_from(tries) or None,
        "router.retries": len(tries_.retried(tries)) if tries else None,
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


def _serving_attributes(rec: RequestRecord) -> dict[str, AttributeValue]:
    """The last try's span: what the provider answered and how fast."""
    attrs: dict[str, Any] = {
        "gen_ai.response.model": rec.provider_model or _wire_model(rec.backend_model),
        "gen_ai.response.id": rec.response_id,
        "gen_ai.response.finish_reasons": rec.finish_reasons or None,
        "router.ttft_ms": rec.ttft_ms,
        "router.decode_ms": rec.decode_ms,
        "router.gap_mean_ms": rec.gap_mean_ms,
        "router.gap_max_ms": rec.gap_max_ms,
    }
    return {k: v for k, v in attrs.items() if v is not None}


def backend_info_from(models: Mapping[str, Any]) -> Callable[[str], BackendInfo | None]:
    """A lookup over a policy's ``models`` (catalog id → spec with ``litellm_model``, ``api_base``)."""

    def info(backend_id: str) -> BackendInfo | None:
        spec = models.get(backend_id)
        if spec is None:
            return None
        provider = spec.litellm_model.split("/", 1)[0] if "/" in spec.litellm_model else "openai"
        if spec.api_base:
            url = urlsplit(spec.api_base)
            return BackendInfo(spec.litellm_model, url.hostname, url.port)
        return BackendInfo(spec.litellm_model, DEFAULT_HOSTS.get(provider))

    return info


def _wire_model(backend_model: str | None) -> str | None:
    return backend_model.split("/", 1)[1] if backend_model and "/" in backend_model else backend_model


def _sum(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 10) if present else None
