"""What is left of the task's and the key's budgets, and which candidates it can hold.

The decision reads these so that neither its ranking nor exploration picks a candidate that
admission (``router.http.admission``) would then refuse: both compare the same held amount
(``held``) with the same budget left (``budget_left``). Pure arithmetic on the request's
features and the candidates' estimates, no I/O.
"""

from __future__ import annotations

from router.features.request import Features
from router.features.task.context import least
from router.store.records import Estimate


def budget_left(features: Features) -> float | None:
    """The least of what is left of the task's and the key's budgets (None: neither has one)."""
    return least(features.task_budget_left, features.key_budget_left)


def exclude_over_budget(features: Features, eligible: list[Estimate]) -> bool:
    """Exclude the eligible candidates whose estimate exceeds the budget left (their ``excluded``
    set), so that neither the ranking nor exploration picks one while a cheaper one fits; return
    whether any fits. False (nothing excluded) when none fits."""
    left = budget_left(features)
    if left is None:
        return True
    # What admission will hold (``Admission.hold``), so that nothing kept here is refused there.
    over = [e for e in eligible if held(e) > left]
    if len(over) == len(eligible):
        return False
    for e in over:
        e.excluded = f"budget: ~${held(e):.6f} > ${left:.6f} left"
    return True


def held(e: Estimate) -> float:
    """What a budget holds for a call on ``e``'s backend: its hold, else its expected cost."""
    return e.hold_usd if e.hold_usd is not None else e.cost_usd
