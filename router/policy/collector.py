"""Metrics of the policy in force, read at scrape time: its revision, refused reloads, rollbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from router.policy.active import ActivePolicy, PolicyHistory


class PolicyCollector(Collector):
    def __init__(self, current: Callable[[], ActivePolicy], history: PolicyHistory) -> None:
        self.current = current
        self.history = history

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily]:
        rt, h = self.current(), self.history
        # An info metric (value 1, the facts as labels): join on it to label any series by revision.
        info = InfoMetricFamily("router_policy", "The policy in force.")
        info.add_metric([], {"revision": rt.revision or "none", "name": rt.policy.name,
                             "scorer": rt.decider.scorer.name})  # fmt: skip
        yield info
        yield CounterMetricFamily(
            "router_policy_reloads_rejected", "Policy reloads refused (the running policy stayed).",
            value=h.rejected_reloads,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "router_policy_rejected", "1 while the policy file on disk is one that was refused.",
            value=int(h.last_rejected is not None),
        )  # fmt: skip
        yield CounterMetricFamily(
            "router_policy_rollbacks", "Rollbacks to an earlier revision made by this router's guard.",
            value=h.rollbacks,
        )  # fmt: skip
