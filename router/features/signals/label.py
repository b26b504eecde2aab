"""Signals → one weak outcome for the task attempt."""

from __future__ import annotations

from collections.abc import Iterable

from router.features.signals.base import TESTS, Signal, WeakLabel


def summarize(signals: Iterable[Signal]) -> WeakLabel | None:
    """The weak outcome the signals imply, or None if none of them judges.

    The latest test run dominates whatever else was seen; without one, the heaviest judging signal
    decides. The label's weight combines the signals that agree with it (noisy-or), so several weak
    failure hints count for more than one.
    """
    judging = [s for s in signals if isinstance(s, Signal) and s.success is not None and s.weight > 0]
    if not judging:
        return None
    tests = [s for s in judging if s.name == TESTS]
    top = max(tests or judging, key=lambda s: s.weight)
    assert top.success is not None  # filtered above; narrows the type
    if top.name == TESTS and top.value is not None:
        score = min(max(top.value, 0.0), 1.0)
    else:
        score = 1.0 if top.success else 0.0
    agree = [s for s in judging if s.success == top.success]
    doubt = 1.0
    for s in agree:
        doubt *= 1.0 - min(s.weight, 1.0)
    details = {
        **top.details,
        "agreeing": sorted({s.name for s in agree}),
        "disagreeing": sorted({s.name for s in judging if s.success != top.success}),
    }
    return WeakLabel(top.success, round(score, 6), top.name, round(1.0 - doubt, 6), details)
