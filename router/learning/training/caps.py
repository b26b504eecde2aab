"""The call caps `router train` learns from a log: per model, ``control.CAP_FACTOR`` × the median
calls of its resolved attempts, where the log says enough about that model's attempts.

A cap stops an agent's attempt, so one learned from too little is worse than none: a toy log (the
demo's, or the fake provider's, whose attempts are a call or two) gives caps of 2 to 4 calls, and
promoted, those would stop every real agent's attempt after its first few steps. So a cap needs
``MIN_RESOLVED_FOR_CAP`` resolved attempts of the model, each on a task of its own, and is never
below ``MIN_CAP`` calls: under it the log's attempts are not an agent's (on the shipped SWE-bench
runs the least cap any model's resolved runs give is 22, twice gpt-5-mini's median of 11 calls).
Where no cap is learned the report says why; ``models.X.max_calls_per_attempt`` sets one by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.features.task.attempt import AttemptControl
from router.learning.training.control import CAP_FACTOR, cap_for

#: Resolved attempts of a model, each on its own task, before ``router train`` gives it a cap.
MIN_RESOLVED_FOR_CAP = 10
#: The least cap learned (calls per attempt).
MIN_CAP = 20


class _Row(Protocol):
    task_id: str
    model: str
    success: bool
    n_calls: int
    failed_before: list[str]


@dataclass(frozen=True)
class Caps:
    controls: dict[str, AttemptControl] = field(default_factory=dict)
    #: Per model of the log without a cap: why.
    not_learned: dict[str, str] = field(default_factory=dict)


def from_log(rows: Sequence[_Row], min_resolved: int = MIN_RESOLVED_FOR_CAP, floor: int = MIN_CAP) -> Caps:
    """Per model of the log, its cap or why it has none. A model's first attempt on a task counts
    (a repeat after its own failure is not a fresh draw of it); the stop-loss, learned from each
    call's reading of the conversation, is ``router.learning.training.stoploss``'s."""
    calls: dict[str, list[int]] = {r.model: [] for r in rows}
    tasks: dict[str, set[str]] = {r.model: set() for r in rows}
    for r in rows:
        if r.success and r.model not in r.failed_before:
            calls[r.model].append(r.n_calls)
            tasks[r.model].add(r.task_id)
    out = Caps()
    for m in sorted(calls):
        cap = cap_for(calls[m])
        if len(tasks[m]) < min_resolved:
            out.not_learned[m] = (f"resolved attempts on {len(tasks[m])} tasks ({len(calls[m])} in all); "
                                  f"a cap needs {min_resolved}")  # fmt: skip
        elif cap is None or cap < floor:
            out.not_learned[m] = (f"{CAP_FACTOR:g} × the median of its resolved attempts' calls is {cap}, under "
                                  f"{floor}: attempts of a call or two are not an agent's")  # fmt: skip
        else:
            out.controls[m] = AttemptControl(max_calls=cap)
    return out


def line(caps: Caps) -> str:
    """What `router train` prints: the caps learned, and why the other models have none (models
    with the same reason together)."""
    said = ", ".join(f"{m} {c.max_calls}" for m, c in caps.controls.items())
    out = (
        f"call caps per attempt ({CAP_FACTOR:g} × the median calls of resolved attempts): {said}"
        if said
        else ""
    )
    why: dict[str, list[str]] = {}
    for m, reason in caps.not_learned.items():
        why.setdefault(reason, []).append(m)
    if why:
        none = "; ".join(f"{', '.join(ms)}: {reason}" for reason, ms in why.items())
        out = f"{out or 'call caps: none'}; no cap for {none}"
        out += " (models.X.max_calls_per_attempt sets one by hand)"
    return out or "call caps: none (no model in the log)"
