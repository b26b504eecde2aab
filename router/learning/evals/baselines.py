"""The alternatives the policy is measured against, each a chooser for the replay.

Everything a baseline learns (which model is strongest, which cascade is best, a classifier and
its threshold) comes from the training tasks only. Fixed sequences stop when they run out of
models; the oracle sees the test outcomes and is the ceiling, not a competitor.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from router.features.task.vector import HASH_DIM, NUMERIC
from router.learning.evals.arrival import Arrival
from router.learning.evals.loader import Dataset
from router.learning.evals.simulate import EXACT, Chooser, Verifier
from router.policy.decide import Decider


def sequence(models: Sequence[str]) -> Chooser:
    """Attempt k goes to ``models[k-1]``; past the end, stop."""
    seq = tuple(models)

    def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        return seq[attempt - 1] if attempt <= len(seq) else None

    return choose


def first_untried(order: Sequence[str]) -> Chooser:
    """The first model in ``order`` that has not failed this task (escalation along a ranking)."""
    ranked = tuple(order)

    def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        return next((m for m in ranked if m not in failed), None)

    return choose


def first_untried_per_task(orders: Mapping[str, Sequence[str]]) -> Chooser:
    """As ``first_untried``, with a ranking of its own for each task."""

    def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        return next((m for m in orders[task_id] if m not in failed), None)

    return choose


def uniform_random(models: Sequence[str], seed: int) -> Chooser:
    """A uniformly random model among those not yet failed, reproducible per task and attempt."""
    names = sorted(models)

    def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        left = [m for m in names if m not in failed]
        return random.Random(f"{seed}:{task_id}:{attempt}").choice(left) if left else None

    return choose


def price_order(decider: Decider, arrival: Arrival) -> list[str]:
    """The router's order without a learned policy: cheapest expected call first."""
    return decider.decide(arrival.features).order


def oracle(data: Dataset) -> Chooser:
    """The cheapest model that resolves the task; for a task none resolves, the cheapest attempt."""

    def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        if attempt > 1:
            return None
        runs = [(data.outcome(task_id, m), m) for m in data.model_ids]
        solved = [(o.cost, m) for o, m in runs if o.resolved]
        return min(solved or [(o.cost, m) for o, m in runs])[1]

    return choose


def competent(data: Dataset, task_ids: Sequence[str], min_resolved: float) -> list[str]:
    """The models resolving at least ``min_resolved`` of ``task_ids`` (all of them if none does)."""
    rates = training_rates(data, task_ids)
    return [m for m, (p, _) in rates.items() if p >= min_resolved] or list(rates)


def training_rates(data: Dataset, task_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per model: (resolved rate, mean cost per task) on ``task_ids``."""
    out = {}
    for m in data.model_ids:
        runs = [data.outcome(t, m) for t in task_ids]
        out[m] = (sum(o.resolved for o in runs) / len(runs), sum(o.cost for o in runs) / len(runs))
    return out


def least_cost_per_completed(data: Dataset, task_ids: Sequence[str]) -> str:
    """The best single model for the default objective: the least cost per completed task."""
    rates = training_rates(data, task_ids)
    return min(rates, key=lambda m: rates[m][1] / rates[m][0] if rates[m][0] else float("inf"))


def strongest_order(data: Dataset, task_ids: Sequence[str]) -> list[str]:
    rates = training_rates(data, task_ids)
    return sorted(rates, key=lambda m: (-rates[m][0], rates[m][1]))


@dataclass(frozen=True, slots=True)
class Cascade:
    models: tuple[str, ...]
    resolved_rate: float
    cost_per_task: float

    @property
    def cost_per_completed(self) -> float:
        return self.cost_per_task / self.resolved_rate if self.resolved_rate > 0 else float("inf")

    @property
    def name(self) -> str:
        return " → ".join(self.models)


def cascades(
    data: Dataset, task_ids: Sequence[str], max_len: int, verifier: Verifier = EXACT
) -> list[Cascade]:
    """Every fixed sequence of distinct models up to ``max_len`` long, scored on ``task_ids``.

    With a noisy verifier, in expectation over its verdicts: a step goes on when its result is
    rejected (a wrong one rightly, a right one falsely) and completes the task when a right one is
    accepted; the last step's right result completes it either way (as the replay counts it).
    """
    models = data.model_ids
    s = np.array([[data.outcome(t, m).resolved for m in models] for t in task_ids], dtype=np.float64)
    c = np.array([[data.outcome(t, m).cost for m in models] for t in task_ids], dtype=np.float64)
    fa, fr = verifier.false_accept, verifier.false_reject
    done = s * (1.0 - fr)
    going = s * fr + (1.0 - s) * (1.0 - fa)
    out: list[Cascade] = []
    for length in range(1, max_len + 1):
        for seq in itertools.permutations(range(len(models)), length):
            alive = np.ones(len(task_ids))
            cost = np.zeros(len(task_ids))
            resolved = np.zeros(len(task_ids))
            for step, j in enumerate(seq, 1):
                cost += alive * c[:, j]
                # The last step's result stands, accepted or not: nothing comes after to replace it.
                resolved += alive * (s[:, j] if step == len(seq) else done[:, j])
                alive = alive * going[:, j]
            out.append(Cascade(tuple(models[j] for j in seq), float(resolved.mean()), float(cost.mean())))
    return out


def best_cascade(candidates: Sequence[Cascade], floor: float | None = None) -> Cascade:
    """The least cost per completed task; with a floor, among those resolving at least that share."""
    meeting = [c for c in candidates if floor is None or c.resolved_rate >= floor]
    if not meeting:
        return max(candidates, key=lambda c: (c.resolved_rate, -c.cost_per_task))
    return min(meeting, key=lambda c: (c.cost_per_completed, len(c.models)))


def _matrix(vectors: Sequence[Mapping[int, float]]) -> sparse.csr_matrix:
    width = len(NUMERIC) + HASH_DIM
    rows, cols, vals = [], [], []
    for i, vec in enumerate(vectors):
        for j, v in vec.items():
            rows.append(i)
            cols.append(j)
            vals.append(v)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(vectors), width))


class ThresholdRouter:
    """RouteLLM-style: a classifier of "the weak model suffices", and a threshold on its score.

    The classifier sees the same task features as the policy. The threshold is set on the
    training tasks' out-of-fold scores so that a target share of tasks goes to the strong model.
    On failure it tries the other model of the pair, then stops.
    """

    def __init__(
        self, data: Dataset, train_ids: Sequence[str], arrivals: Mapping[str, Arrival], weak: str, strong: str
    ) -> None:
        self.weak, self.strong = weak, strong
        self.arrivals = arrivals
        x = _matrix([arrivals[t].vector for t in train_ids])
        y = np.array([data.outcome(t, weak).resolved for t in train_ids], dtype=int)
        clf = LogisticRegression(C=0.5, fit_intercept=False, max_iter=2000)
        folds = int(min(5, y.sum(), len(y) - y.sum()))
        if folds >= 2:
            cv = StratifiedKFold(folds, shuffle=True, random_state=0)
            self.train_scores = cross_val_predict(clf, x, y, cv=cv, method="decision_function")
            self.clf: LogisticRegression | None = clf.fit(x, y)
        else:  # one class only: every task scores the same
            self.train_scores = np.zeros(len(y))
            self.clf = None

    def threshold(self, strong_share: float) -> float:
        """The score below which a task goes to the strong model, for this share on the training tasks."""
        if strong_share <= 0:
            return -np.inf
        if strong_share >= 1:
            return np.inf
        return float(np.quantile(self.train_scores, strong_share))

    def chooser(self, strong_share: float) -> Chooser:
        cut = self.threshold(strong_share)
        scores: dict[str, float] = {}

        def choose(task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
            if task_id not in scores:
                x = _matrix([self.arrivals[task_id].vector])
                scores[task_id] = float(self.clf.decision_function(x)[0]) if self.clf is not None else 0.0
            first = self.strong if scores[task_id] < cut else self.weak
            second = self.weak if first == self.strong else self.strong
            return (first, second)[attempt - 1] if attempt <= 2 else None

        return choose
