"""How far above its target, and among orders of how many models, an order must be chosen on the
training tasks to reach its target on new ones at the least cost.

The cheapest of many orders that reaches a target on the training tasks is, more often than not,
one whose success there ran high: a winner's curse (on SWE-bench, the order of up to four models
chosen for 80% resolved 77.8% of the held-out tasks, the one for 75% 74.2%), and the more orders
are searched (four models rather than three) the stronger it is. What to correct is measured on
the training tasks alone, by an inner cross-validation: for each choice of a margin of
``MARGINS`` and a longest order (1 to N models), the order chosen on the other folds at target +
margin is scored on the fold left out (a task's rows stay together); of the choices whose pooled
held-out share resolved reaches the target, the one with the least held-out cost per completed
task is kept (ties: the shorter, then the smaller margin); where none reaches it, the one
resolving most. The order is then chosen on every training task with that choice. Never measured
on test folds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

#: Margins tried, in shares of all tasks (0 to 4 points).
MARGINS = (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04)
INNER_FOLDS = 4

#: (rows to choose on, the choices (longest, target)) → the order chosen at each (model indices).
Choose = Callable[[np.ndarray, Sequence[tuple[int, float]]], Sequence[Sequence[int]]]
#: (rows left out, an order) → (the weighted share of those rows it resolves, its cost per row).
Score = Callable[[np.ndarray, Sequence[int]], tuple[float, float]]


@dataclass(frozen=True)
class Margin:
    margin: float
    #: The longest order to choose among (None: as long as allowed).
    longest: int | None
    #: Per choice tried, (longest, margin): its pooled held-out share resolved and cost per completed task.
    held_out: dict[tuple[int, float], tuple[float, float]]

    def at(self, target: float) -> float:
        """The share an order is chosen at for ``target``."""
        return target + self.margin


def inner_folds(groups: Sequence[str], k: int, seed: int) -> list[np.ndarray]:
    """Row indices per fold: the distinct tasks shuffled (seeded) and dealt round-robin, so a
    task's rows stay together."""
    tasks = sorted(set(groups))
    random.Random(f"inner-margin:{seed}").shuffle(tasks)
    fold_of = {t: i % k for i, t in enumerate(tasks)}
    of = np.array([fold_of[g] for g in groups])
    return [np.flatnonzero(of == i) for i in range(k)]


def learn(
    groups: Sequence[str], weights: np.ndarray, target: float, max_len: int, choose: Choose, score: Score,
    *, folds: int = INNER_FOLDS, margins: Sequence[float] = MARGINS, seed: int = 0,
) -> Margin:  # fmt: skip
    """The margin above ``target`` and the longest order to choose at. ``groups``: the task each
    row stands for; ``weights``: how much each row counts (a held-out fold's share is its weight)."""
    if len(set(groups)) < folds:
        return Margin(0.0, None, {})
    choices = [(k, m) for k in range(1, max_len + 1) for m in margins]
    every = np.arange(len(groups))
    done, spent = dict.fromkeys(choices, 0.0), dict.fromkeys(choices, 0.0)
    mass = 0.0
    for held in inner_folds(groups, folds, seed):
        fit = np.setdiff1d(every, held, assume_unique=True)
        share = float(weights[held].sum())
        for c, seq in zip(choices, choose(fit, [(k, target + m) for k, m in choices]), strict=True):
            got, cost = score(held, seq)
            done[c] += share * got
            spent[c] += share * cost
        mass += share
    held_out = {c: (done[c] / mass, spent[c] / done[c] if done[c] > 0 else float("inf")) for c in choices}
    reaching = [c for c in choices if held_out[c][0] >= target - 1e-12]
    if reaching:
        k, m = min(reaching, key=lambda c: (held_out[c][1], c))
    else:
        k, m = max(choices, key=lambda c: (held_out[c][0], -c[0], -c[1]))
    return Margin(m, k, held_out)
