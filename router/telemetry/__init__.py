"""Telemetry: OpenTelemetry traces and Prometheus metrics of proxied requests.

The request path calls three hooks and nothing else (through ``router.http.recorder``):
``started(request)`` when a request arrives, ``prompt_sized`` once its prompt has been sized, and
``finished(record, phases)`` once its log record is complete. Spans are built after the fact from
the recorded phase timestamps, so tracing adds no work between the client and the backend.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from router.store.records import RequestRecord
from router.telemetry.metrics import RequestMetrics, StartedRequest
from router.telemetry.phases import Phases

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from router.telemetry.tracing import RequestTracer

log = logging.getLogger("router.telemetry")


class RoutePattern(Protocol):
    @property
    def match(self) -> str: ...


class RoutedPolicy(Protocol):
    """What telemetry reads of the policy in force (``router.policy.config.Policy``, a layer above):
    its routes, to label cost by pattern, and its models, to name a span's backend."""

    @property
    def models(self) -> Mapping[str, Any]: ...

    def route_for(self, requested: str) -> RoutePattern | None: ...


class Telemetry:
    """The no-op base: what runs when neither tracing nor metrics are configured."""

    def started(self, request: StartedRequest) -> None:
        pass

    def finished(self, record: RequestRecord, phases: Phases) -> None:
        pass

    def exposition(self) -> bytes | None:
        """The Prometheus text exposition of the metrics, or None when there are none."""
        return None

    def close(self) -> None:
        """Flush and stop exporters (idempotent)."""

    def use_policy(self, current: Callable[[], RoutedPolicy]) -> None:
        """Where to find the policy in force (it may be reloaded), for naming routes."""

    def prompt_sized(self, remembered: bool, counted: bool) -> None:
        """A prompt was sized: from the conversation memo or not; counted exactly before deciding or not."""


class RouterTelemetry(Telemetry):
    """Metrics always (in-process counters, cheap); spans only when a tracer is configured.

    Telemetry must never fail a request: the hooks run inside its handling (``finished`` in
    ``Recorder.close``, the reply's or the stream's last step), so an exception here is logged, not
    raised.
    """

    def __init__(self, metrics: RequestMetrics, tracer: RequestTracer | None = None) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self._failed_once = False

    def started(self, request: StartedRequest) -> None:
        self._guard(self.metrics.started, request)

    def finished(self, record: RequestRecord, phases: Phases) -> None:
        self._guard(self.metrics.finished, record, phases)
        if self.tracer is not None:
            self._guard(self.tracer.record, record, phases)

    def exposition(self) -> bytes:
        return self.metrics.exposition()

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.shutdown()

    def use_policy(self, current: Callable[[], RoutedPolicy]) -> None:
        self.metrics.route_of = _route_namer(current)
        if self.tracer is not None:
            from router.telemetry.tracing import backend_info_from

            self.tracer.backend_info = lambda backend_id: backend_info_from(current().models)(backend_id)

    def prompt_sized(self, remembered: bool, counted: bool) -> None:
        self._guard(self.metrics.prompt_sized, remembered, counted)

    def _guard(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            if not self._failed_once:  # once: a systematic bug must not flood the log per request
                self._failed_once = True
                log.exception("telemetry failed (further failures are not logged)")


def build_telemetry(
    *,
    trace_prompts: bool = False,
    env: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> RouterTelemetry:
    """Metrics on a registry of their own; tracing when ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``
    is set in ``env`` (default: the process environment) or an ``exporter`` is given (tests)."""
    from router.telemetry import tracing

    metrics = RequestMetrics()
    tracer = None
    if exporter is not None or tracing.otlp_configured(os.environ if env is None else env):
        tracer = tracing.build_tracer(exporter=exporter, prompts=trace_prompts)
    return RouterTelemetry(metrics, tracer)


def _route_namer(current: Callable[[], RoutedPolicy]) -> Callable[[str | None], str]:
    """Label cost by the route's pattern, not the client's model string: clients choose that
    string freely, and an unbounded label would grow the registry without limit."""

    def route_of(requested: str | None) -> str:
        route = current().route_for(requested) if requested else None
        return route.match if route is not None else "none"

    return route_of
