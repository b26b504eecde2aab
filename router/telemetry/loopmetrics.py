"""Histograms and counters changed on the event loop alone: prometheus_client's, without its locks.

prometheus_client takes a lock for every value it changes, and an observation scans the
histogram's bounds in Python and takes two: the ten histograms and handful of counters a request
updates cost ~0.1 M instructions a replayed turn. ``RequestMetrics`` changes its values on the
event loop only (the requests' ends, the decisions), so a child here is a plain list of bucket
counts found with ``bisect``; a scrape reads them as a collector and writes the same exposition
as prometheus_client's ``Histogram`` and ``Counter`` of the same name, labels and buckets.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Child = TypeVar("Child", "Observed", "Counted")


class Observed:
    """One histogram child: how many observations fell in each bucket (+Inf last), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # The first bound >= amount: prometheus's bucket ``le`` holds the observations <= it.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class Counted:
    """One counter child."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _Family(Collector, Generic[Child]):
    def __init__(self, name: str, doc: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.children: dict[tuple[str, ...], Child] = {}
        if not self.labelnames:  # exposed from the start, as prometheus_client does
            self.children[()] = self._new()
        registry.register(self)

    @abstractmethod
    def _new(self) -> Child:
        """Overridden by each kind of metric."""

    def labels(self, *values: str) -> Child:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {values!r}")
            child = self.children[values] = self._new()
        return child

    @abstractmethod
    def _family(self) -> Metric:
        """Overridden by each kind of metric."""

    @abstractmethod
    def _add(self, family: Any, values: list[str], child: Child) -> None:
        """Overridden by each kind of metric."""

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        for values, child in list(self.children.items()):
            self._add(family, list(values), child)
        return [family]


class LoopHistogram(_Family[Observed]):
    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.bounds = tuple(float(b) for b in buckets if b != float("inf"))
        self._les = [*map(floatToGoString, self.bounds), "+Inf"]
        super().__init__(name, doc, labelnames, registry)

    def _new(self) -> Observed:
        return Observed(self.bounds)

    def observe(self, amount: float) -> None:
        """For a histogram without labels."""
        self.children[()].observe(amount)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)

    def _add(self, family: HistogramMetricFamily, values: list[str], child: Observed) -> None:
        family.add_metric(values, list(zip(self._les, accumulate(child.counts), strict=True)), child.sum)


class LoopCounter(_Family[Counted]):
    def _new(self) -> Counted:
        return Counted()

    def inc(self, amount: float = 1) -> None:
        """For a counter without labels."""
        self.children[()].inc(amount)

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.doc, labels=self.labelnames)

    def _add(self, family: CounterMetricFamily, values: list[str], child: Counted) -> None:
        family.add_metric(values, child.value)
