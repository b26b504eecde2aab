"""Prometheus metrics of proxied requests, on a registry of the app's own (never the global one).

Every latency observed here is the number written to the log record (``rec.ttft_ms`` and so
on), so a dashboard and ``router report`` cannot disagree about what a request measured. Units
are Prometheus base units: seconds, tokens, US dollars.

Labels are bounded: ``backend`` is a catalog id (or ``none`` before one was chosen), ``route``
the matching route's pattern, ``status`` an HTTP status, ``kind`` a token kind, ``reason`` an
error class name. Nothing a client chooses freely becomes a label value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.store.records import RequestRecord
from router.telemetry import tries as tries_
from router.telemetry.loopmetrics import LoopCounter, LoopHistogram
from router.telemetry.phases import Phases

__all__ = ["CONTENT_TYPE_LATEST", "RequestMetrics"]


def series(low: float, high: float) -> tuple[float, ...]:
    """Bucket bounds from ``low`` to ``high``, ten a decade (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8).

    ``histogram_quantile`` interpolates linearly inside a bucket, so a quantile read from
    Prometheus is off by at most the bucket's width; adjacent bounds here differ by at most a
    third (a cluster of requests inside one bucket reads up to a sixth off, a spread a few %).
    Coarser buckets (0.1 → 0.25 → 0.5 s) put a 152 ms median at 175 ms.
    """
    out: list[float] = []
    exponent = math.floor(math.log10(low))
    while not out or out[-1] < high:
        for mantissa in (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8):
            bound = round(mantissa * 10.0**exponent, 9)
            if low <= bound <= high:
                out.append(bound)
        exponent += 1
    return tuple(out)


# Agents live between tens of ms (a cached short prompt) and tens of seconds (a long reasoning
# call); beyond a minute, a few coarse buckets still show the tail.
LATENCY_BUCKETS = (*series(0.01, 60), 120, 300, 600)
# Waiting for a slot: usually under a millisecond (coarse there), then as fine as the latencies.
QUEUE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, *LATENCY_BUCKETS[:-2])
# Parsing, features and the decision: sub-millisecond normally; a learned scorer may take longer.
ROUTING_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
# Between two streamed tokens: a few ms at fast providers; the worst gap of a request reaches
# seconds when a provider stalls.
GAP_BUCKETS = (*series(0.001, 10), 30, 60, 120)
DECODE_RATE_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2500)
PREFILL_RATE_BUCKETS = (100, 250, 500, 1000, 2500, 5000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000)

TOKEN_KINDS = ("input", "output", "cache_read", "cache_write", "reasoning")


class StartedRequest(Protocol):
    """A request being handled: whether it streams is known once it has been parsed."""

    @property
    def request_id(self) -> str: ...

    @property
    def stream(self) -> bool: ...


class RequestMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        route_of: Callable[[str | None], str] | None = None,
        *,
        process: bool = True,
    ) -> None:
        # A ``_created`` series per child would double the series count for a value nobody graphs.
        prometheus_client.disable_created_metrics()
        r = self.registry = registry if registry is not None else CollectorRegistry()
        #: requested model → route label; "none" until the app names its policy (``use_policy``).
        self.route_of: Callable[[str | None], str] = route_of or (lambda _requested: "none")
        if process:
            ProcessCollector(registry=r)  # CPU, memory, open files of this router process

        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> LoopHistogram:
            return LoopHistogram(name, doc, labels, buckets, r)

        self.ttft = hist("router_ttft_seconds", "Upstream call to first content token (streamed requests).",
                         ("backend",), LATENCY_BUCKETS)  # fmt: skip
        self.gap_mean = hist("router_inter_token_gap_mean_seconds",
                             "Mean gap between content tokens of a streamed request (one per request).",
                             ("backend",), GAP_BUCKETS)  # fmt: skip
        self.gap_max = hist("router_inter_token_gap_max_seconds",
                            "Longest gap between content tokens of a streamed request (one per request): "
                            "stalls.", ("backend",), GAP_BUCKETS)  # fmt: skip
        self.decode = hist("router_decode_seconds", "First to last content token (streamed requests).",
                           ("backend",), LATENCY_BUCKETS)  # fmt: skip
        self.queue = hist("router_queue_seconds",
                          "Arrival to the first try's upstream call: intake, routing, concurrency waits.",
                          ("backend",), QUEUE_BUCKETS)  # fmt: skip
        self.retry = hist("router_retry_seconds",
                          "First try's upstream call to the last try's: failed tries and back-off "
                          "(requests that retried or fell back; backend is the last one tried).",
                          ("backend",), LATENCY_BUCKETS)  # fmt: skip
        self.routing = hist("router_routing_seconds", "Arrival to the policy's decision (read, parse, decide).",
                            (), ROUTING_BUCKETS)  # fmt: skip
        self.delivery = hist("router_delivery_seconds", "Last upstream byte to the response's end.",
                             ("backend",), QUEUE_BUCKETS)  # fmt: skip
        self.e2e = hist("router_request_duration_seconds", "Arrival to the response's end.",
                        ("backend", "status"), LATENCY_BUCKETS)  # fmt: skip
        self.decode_rate = hist("router_decode_tokens_per_second",
                                "Output tokens over decode time (streamed requests).",
                                ("backend",), DECODE_RATE_BUCKETS)  # fmt: skip
        self.prefill_rate = hist("router_prefill_tokens_per_second",
                                 "Prompt tokens over time to first token (streamed requests).",
                                 ("backend",), PREFILL_RATE_BUCKETS)  # fmt: skip
        self.requests = LoopCounter("router_requests", "Requests by the backend that served (or failed last) "
                                    "and the status the client got.", ("backend", "status"), r)  # fmt: skip
        self.tokens = LoopCounter("router_tokens", "Tokens by kind; input includes cached tokens.",
                                  ("backend", "kind"), r)  # fmt: skip
        self.cost = LoopCounter("router_cost_usd", "Cost at catalog prices, by backend and route.",
                                ("backend", "route"), r)  # fmt: skip
        self.fallbacks = LoopCounter("router_fallbacks", "Requests served (or failed) after another backend "
                                     "was tried first; backend is the last one tried.", ("backend",), r)  # fmt: skip
        self.retries = LoopCounter("router_retries", "Failed upstream tries retried on the same backend, by "
                                   "the backend and why the try failed.", ("backend", "reason"), r)  # fmt: skip
        self.memo = LoopCounter("router_prompt_memo", "Requests by whether the conversation memo knew their "
                                "leading messages (hit) or not (miss).", ("result",), r)  # fmt: skip
        self.counted = LoopCounter("router_prompt_counted_before_decision", "Requests whose prompt had to be "
                                   "counted exactly before deciding (the estimate's bounds mattered).",
                                   (), r)  # fmt: skip
        self.cache_hit = Gauge("router_prompt_cache_hit_ratio", "Cached share of input tokens since start "
                               "(for a window use rate of router_tokens_total cache_read over input).",
                               ("backend",), registry=r)  # fmt: skip
        # Records of requests in flight: the stream gauge counts the ones that asked to stream,
        # which is only known after parsing, hence records rather than two counters.
        self._inflight: dict[str, StartedRequest] = {}
        inflight = self._inflight
        Gauge("router_inflight_requests", "Requests being handled now.", registry=r).set_function(
            lambda: len(inflight)
        )
        Gauge("router_inflight_streams", "Streamed requests being handled now.", registry=r).set_function(
            lambda: sum(1 for rec in list(inflight.values()) if rec.stream)
        )
        self._cache_tally: dict[str, tuple[int, int]] = {}  # backend → (input tokens, cached tokens)
        # A gauge's ``labels()`` validates and locks on every call: each backend's child is looked up once.
        self._ratios: dict[str, Any] = {}

    def _ratio(self, backend: str) -> Any:
        child = self._ratios.get(backend)
        if child is None:
            child = self._ratios[backend] = self.cache_hit.labels(backend)
        return child

    def started(self, request: StartedRequest) -> None:
        self._inflight[request.request_id] = request

    def finished(self, rec: RequestRecord, phases: Phases) -> None:
        self._inflight.pop(rec.request_id, None)
        backend = rec.chosen_model or "none"
        self.requests.labels(backend, str(rec.status or "none")).inc()
        if phases.decided is not None:
            self.routing.observe(phases.decided - phases.arrival)
        self._observe_ms(self.queue, backend, rec.queue_ms)
        self._observe_ms(self.retry, backend, rec.retry_ms)
        self._observe_ms(self.ttft, backend, rec.ttft_ms)
        self._observe_ms(self.decode, backend, rec.decode_ms)
        self._observe_ms(self.gap_mean, backend, rec.gap_mean_ms)
        self._observe_ms(self.gap_max, backend, rec.gap_max_ms)
        self._observe_ms(self.delivery, backend, rec.delivery_ms)
        if rec.total_ms is not None:
            self.e2e.labels(backend, str(rec.status or "none")).observe(rec.total_ms / 1000)
        if rec.decode_ms and rec.output_tokens:
            self.decode_rate.labels(backend).observe(rec.output_tokens / (rec.decode_ms / 1000))
        if rec.ttft_ms and rec.input_tokens:
            self.prefill_rate.labels(backend).observe(rec.input_tokens / (rec.ttft_ms / 1000))
        self._count_tokens(rec, backend)
        if rec.cost_usd:
            self.cost.labels(backend, self.route_of(rec.requested_model)).inc(rec.cost_usd)
        if tries_.fallen_back_from(rec.tries):
            self.fallbacks.labels(backend).inc()
        for t in tries_.retried(rec.tries):
            self.retries.labels(t.model or "none", tries_.reason(t)).inc()

    def prompt_sized(self, remembered: bool, counted: bool) -> None:
        self.memo.labels("hit" if remembered else "miss").inc()
        if counted:
            self.counted.inc()

    def _count_tokens(self, rec: RequestRecord, backend: str) -> None:
        values = (rec.input_tokens, rec.output_tokens, rec.cache_read_tokens, rec.cache_write_tokens,
                  rec.reasoning_tokens)  # fmt: skip
        for kind, n in zip(TOKEN_KINDS, values, strict=True):
            if n:
                self.tokens.labels(backend, kind).inc(n)
        if rec.input_tokens:
            inputs, cached = self._cache_tally.get(backend, (0, 0))
            inputs, cached = inputs + rec.input_tokens, cached + (rec.cache_read_tokens or 0)
            self._cache_tally[backend] = (inputs, cached)
            self._ratio(backend).set(cached / inputs)

    def _observe_ms(self, h: LoopHistogram, backend: str, ms: float | None) -> None:
        if ms is not None:
            h.labels(backend).observe(ms / 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
