"""Control inside an attempt (pure): is the attempt's next call refused, and why?

An attempt is many calls, and the router sees each one before it is made. Two rules end an
attempt early, each per model: a cap on its calls (a resolved run is usually short: the learned
default is about twice the median calls of the model's resolved runs), and a stop-loss that ends it
when the label model's P(success | the conversation so far) falls below a threshold, looked at
only once the attempt has made ``min_calls`` calls (its first turns say little). The stop-loss is
on only where ``router train`` found it beat a random stop of the same share. A stopped attempt
counts as failed, and the task goes on to the next model of its plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

CAP: Final = "max_calls_per_attempt"
STOP_LOSS: Final = "stop_loss"
#: The stop-loss reads the conversation only from this many calls on (the first turns read the repo).
MIN_CALLS: Final = 3


@dataclass(frozen=True, slots=True)
class AttemptControl:
    """One model's rules; None turns a rule off."""

    max_calls: int | None = None
    stop_below: float | None = None
    min_calls: int = MIN_CALLS

    @property
    def active(self) -> bool:
        return self.max_calls is not None or self.stop_below is not None


NONE: Final = AttemptControl()


def stop_reason(control: AttemptControl, calls_made: int, p_success: float | None = None) -> str | None:
    """Why the call after ``calls_made`` calls of this attempt is refused (None: it is made).
    ``p_success``: the label model's reading of the conversation so far, if there is one."""
    if control.max_calls is not None and calls_made >= control.max_calls:
        return CAP
    if (
        control.stop_below is not None
        and p_success is not None
        and calls_made >= control.min_calls
        and p_success < control.stop_below
    ):
        return STOP_LOSS
    return None


def message(
    reason: str, model: str, calls_made: int, control: AttemptControl, p_success: float | None
) -> str:
    """Why the attempt was stopped (the error body's message begins with it; what comes next is
    the policy's to add: ``router.policy.following.told``)."""
    if reason == CAP:
        why = f"its {calls_made} calls reached models.{model}.max_calls_per_attempt ({control.max_calls})"
    else:
        p = "?" if p_success is None else f"{p_success:.2f}"
        why = f"the conversation's P(success) {p} fell below the stop-loss threshold {control.stop_below:.2f}"
    return f"attempt stopped by the router on {model}: {why}"


def first_stop(
    control: AttemptControl, calls: int, readings: Sequence[float] | None = None
) -> tuple[int, str] | None:  # fmt: skip
    """Where a recorded run of ``calls`` calls would have been stopped: (calls made, reason), or
    None. ``readings``: P(success) before each call, where the conversation is known."""
    if not control.active:
        return None
    for k in range(calls):
        p = float(readings[k]) if readings is not None and k < len(readings) else None
        why = stop_reason(control, k, p)
        if why is not None:
            return k, why
    return None
