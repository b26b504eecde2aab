"""What the learned scorer is asked to do and what it answers: the objective's knobs, the plan it
chose for a task, and the recommendation after a failure (``POST /v1/outcomes`` ``next``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from router.policy.plan import Option, Plan


@dataclass(frozen=True, slots=True)
class Objective:
    """The knobs of the objective, from the policy file; ``value`` is USD per completed task
    (given, or calibrated from a target), None for each task's least cost per completed task."""

    max_attempts: int = 3
    value: float | None = None
    max_cost_per_task: float | None = None
    #: The best fixed order on the training log for this objective (None: plan each task alone),
    #: and by how much (a share of ``value``) a task's own plan must beat it to leave it.
    prior: tuple[str, ...] | None = None
    margin: float = math.inf
    #: The success target the value stands for, when the policy gives one.
    target: float | None = None
    #: No value or target was given: single shot serves the best single model on the training log
    #: (the value is the one at which it is the prior plan, for weighing deviations).
    default: bool = False


@dataclass(frozen=True, slots=True)
class Next:
    """What the policy recommends after a failed attempt: another one (on ``model``), or stop."""

    retry: bool
    model: str | None
    #: Of the plan from here: the chance the task still gets done, and what that costs on average.
    expected_success: float
    expected_cost_usd: float

    def as_dict(self) -> dict[str, Any]:
        return {"retry": self.retry, "model": self.model, "expected_success": round(self.expected_success, 4),
                "expected_cost_usd": round(self.expected_cost_usd, 6)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Choice:
    """A plan chosen for a task: the plan served, the options it came from, whether another
    attempt is recommended, and whether the plan is what is left of the prior plan."""

    plan: Plan
    options: tuple[Option, ...]
    go: bool
    prior: bool
