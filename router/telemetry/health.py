"""Metrics of the router's own dependencies, read at scrape time: shared state and the log writer."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.shared import SharedState
from router.shared.types import BreakerState
from router.store.writer import LogWriter


class HealthCollector(Collector):
    def __init__(self, state: SharedState, writer: LogWriter) -> None:
        self.state = state
        self.writer = writer

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        state = self.state
        fail_open = CounterMetricFamily(
            "router_state_fail_open", "Shared-state calls served from local state because Redis was away.",
            labels=["component"],
        )  # fmt: skip
        for component, n in state.fail_open_counts.items():
            fail_open.add_metric([component], n)
        yield fail_open
        fail_closed = CounterMetricFamily(
            "router_state_fail_closed", "Shared-state calls refused because Redis was away (budgets).",
            labels=["component"],
        )  # fmt: skip
        for component, n in getattr(state, "fail_closed_counts", {}).items():
            fail_closed.add_metric([component], n)
        yield fail_closed
        yield GaugeMetricFamily(
            "router_state_degraded", "1 while Redis is unreachable.", value=int(state.degraded)
        )
        w = self.writer
        records = CounterMetricFamily("router_log_records", "Log records by fate.", labels=["fate"])
        for fate, n in (("written", w.written), ("dropped", w.dropped), ("rejected", w.rejected)):
            records.add_metric([fate], n)
        yield records
        yield CounterMetricFamily(
            "router_log_write_failures", "Failed log store writes (retried).", value=w.failures
        )
        yield GaugeMetricFamily("router_log_buffered", "Log records waiting for the store.", value=w.buffered)
        breakers = GaugeMetricFamily(
            "router_breaker_state", "1 for each backend's breaker state as this replica sees it "
            "(closed, open: skipped, half_open: one probe allowed).", labels=["backend", "state"],
        )  # fmt: skip
        for backend, current in sorted(state.breakers.local_states().items()):
            for name in BreakerState:
                breakers.add_metric([backend, name.value], int(current == name))
        yield breakers
