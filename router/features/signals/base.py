"""What signal extraction produces: single observations (``Signal``) and one weak outcome (``WeakLabel``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

TESTS: Final = "tests"
EXIT_CODE: Final = "exit_code"
BUILD_ERROR: Final = "build_error"
RUNTIME_ERROR: Final = "runtime_error"
TOOL_LOOP: Final = "tool_loop"
TOOL_FAILURES: Final = "tool_failures"
RESENT: Final = "resent"


@dataclass(frozen=True, slots=True)
class Signal:
    """One implicit observation read from a conversation.

    ``success`` is the weak label the observation implies (None when it only describes), ``weight``
    how much it should count (0..1), ``value`` a number whose meaning depends on ``name`` (the pass
    fraction for tests, the code for exit_code, the repeat count for loops and failures).
    """

    name: str
    value: float | None
    success: bool | None
    weight: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WeakLabel:
    """A task outcome inferred from signals; ``source`` names the signal it rests on."""

    success: bool
    score: float
    source: str
    weight: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Weights:
    """Base weight of each kind of evidence, before the age discount."""

    tests: float = 1.0
    build_error: float = 0.4
    tool_failures: float = 0.3
    runtime_error: float = 0.2
    tool_loop: float = 0.2
    resent: float = 0.2
    exit_code: float = 0.1
    #: Evidence from older tool results says less about where the task stands now: weight * decay**age,
    #: where age counts the tool results that came after it.
    decay: float = 0.85

    def aged(self, base: float, age: int) -> float:
        return round(base * self.decay ** max(age, 0), 6)


DEFAULT_WEIGHTS: Final = Weights()


def resent_signal(repeats: int, weights: Weights = DEFAULT_WEIGHTS) -> Signal:
    """The agent re-sent an identical request (``repeats`` times in a row): its last answer did not serve."""
    return Signal(RESENT, float(repeats), False, weights.resent, {"repeats": repeats})
