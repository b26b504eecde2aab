"""A conversation → its outcome label: P(success) from the label model, as a ``WeakLabel``.

The proxy calls this off the request path (a background task), with the conversation memo's
slots, so each message is read once; `router eval-labels` calls the same function on replayed
trajectories. The hand-weighted signals (tests, exit codes, loops, resends) ride along in the
label's details: they explain it, the model decides it, except that an attempt still in a tool
loop is never a success (``LOOPING_P``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from router.features.labels import features
from router.features.labels.model import SOURCE, LabelModel
from router.features.signals.base import TOOL_LOOP, Signal, WeakLabel

#: P(success) at most, of an attempt whose latest tool calls are one call repeated past the loop
#: threshold (``looping``). The model cannot see it: its features are shares and sums over the
#: whole conversation, where a long loop of one short call reads like a long, careful attempt
#: (a 1,131-turn loop of ``ls`` had P 0.915). None of the 361 real runs the model was fitted on
#: ends in one, so this is not fitted: it says failure, at half the weight of an explicit outcome.
LOOPING_P: Final = 0.25


@dataclass(frozen=True, slots=True)
class LabelReading:
    """The label model's view of a conversation: its features and P(success)."""

    x: dict[str, float]
    p: float


def read(messages: Sequence[Any], model: LabelModel, seen: list[Any] | None = None) -> LabelReading:
    x = features.of(messages, seen)
    return LabelReading(x, model.p_success(x))


def looping(found: Sequence[Signal]) -> bool:
    """Whether the signals say the agent's latest tool calls are a loop it is still in."""
    return any(s.name == TOOL_LOOP and s.details.get("ongoing") for s in found)


def capped(p: float, loop: bool) -> float:
    """P(success) as the label says it: the model's, at most ``LOOPING_P`` in a loop."""
    return min(p, LOOPING_P) if loop else p


def label(reading: LabelReading, model: LabelModel, found: Sequence[Signal] = ()) -> WeakLabel:
    """The weak label: success when P reaches the model's threshold; its weight is the evidence
    margin |2P − 1| (a coin flip weighs nothing, an explicit outcome, weight 1, always more).
    An attempt in a tool loop is a failure whatever the model says (``LOOPING_P``)."""
    loop = looping(found)
    p = capped(reading.p, loop)
    details = {
        "p": round(p, 6),
        "model": model.sha256[:12],
        "features": {k: round(v, 6) for k, v in reading.x.items()},
        "signals": sorted({s.name for s in found}),
    }
    if loop:
        details["model_p"] = round(reading.p, 6)  # what the model alone said, for people
    success = p >= model.threshold and not loop  # a threshold of LOOPING_P or less is no way out
    return WeakLabel(success, round(p, 6), SOURCE, round(abs(2 * p - 1), 6), details)
