"""The event loop's histograms and counters write what prometheus_client's would."""

from __future__ import annotations

import random

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from router.telemetry.loopmetrics import LoopCounter, LoopHistogram
from router.telemetry.metrics import LATENCY_BUCKETS, QUEUE_BUCKETS


@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS, QUEUE_BUCKETS, (1, 5, 10)])
def test_a_histogram_exposes_what_prometheus_clients_does(buckets: tuple[float, ...]) -> None:
    prometheus_client.disable_created_metrics()
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    h = Histogram("x_seconds", "doc", ("backend", "status"), registry=theirs, buckets=buckets)
    lh = LoopHistogram("x_seconds", "doc", ("backend", "status"), buckets, ours)
    u = Histogram("y_seconds", "doc", (), registry=theirs, buckets=buckets)
    lu = LoopHistogram("y_seconds", "doc", (), buckets, ours)
    rng = random.Random(0)
    # Each bound exactly (``le`` holds it), around it, below the first and past the last.
    values = [0.0, -1.0, 1e9, *buckets, *(b * 1.000001 for b in buckets), *(b * 0.999999 for b in buckets)]
    values += [rng.lognormvariate(-3, 3) for _ in range(2000)]
    for v in values:
        labels = (rng.choice(("a", "b")), rng.choice(("200", "500")))
        h.labels(*labels).observe(v)
        lh.labels(*labels).observe(v)
    u.observe(0.5)
    lu.observe(0.5)
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_counter_exposes_what_prometheus_clients_does() -> None:
    prometheus_client.disable_created_metrics()
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    c, lc = Counter("n", "doc", ("kind",), registry=theirs), LoopCounter("n", "doc", ("kind",), ours)
    u, lu = Counter("m", "doc", registry=theirs), LoopCounter("m", "doc", (), ours)
    assert generate_latest(ours) == generate_latest(theirs)  # an unlabelled counter shows its 0 at once
    for kind, n in [("in", 3), ("out", 0.25), ("in", 7)]:
        c.labels(kind).inc(n)
        lc.labels(kind).inc(n)
    u.inc()
    lu.inc()
    assert generate_latest(ours) == generate_latest(theirs)
    with pytest.raises(ValueError):
        lc.labels("in").inc(-1)
    with pytest.raises(ValueError):
        lc.labels("in", "extra")
