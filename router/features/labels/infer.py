"""A conversation → its outcome label: P(success) from the label model, as a ``WeakLabel``.

The proxy calls this off the request path (a background task), with the conversation memo's
slots, so each message is read once; `router eval-labels` calls the same function on replayed
trajectories. The hand-weighted signals (tests, exit codes, loops, resends) ride along in the
label's details: they explain it, the model decides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.features.labels import features
from router.features.labels.model import SOURCE, LabelModel
from router.features.signals.base import Signal, WeakLabel


@dataclass(frozen=True, slots=True)
class LabelReading:
    """The label model's view of a conversation: its features and P(success)."""

    x: dict[str, float]
    p: float


def read(messages: Sequence[Any], model: LabelModel, seen: list[Any] | None = None) -> LabelReading:
    x = features.of(messages, seen)
    return LabelReading(x, model.p_success(x))


def label(reading: LabelReading, model: LabelModel, found: Sequence[Signal] = ()) -> WeakLabel:
    """The weak label: success when P reaches the model's threshold; its weight is the evidence
    margin |2P − 1| (a coin flip weighs nothing, an explicit outcome, weight 1, always more)."""
    p = reading.p
    details = {
        "p": round(p, 6),
        "model": model.sha256[:12],
        "features": {k: round(v, 6) for k, v in reading.x.items()},
        "signals": sorted({s.name for s in found}),
    }
    return WeakLabel(p >= model.threshold, round(p, 6), SOURCE, round(abs(2 * p - 1), 6), details)
