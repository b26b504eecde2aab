"""The value of a completed task at which the policy meets a success target, from training data.

A target (``objective.target_success``) is a fleet-wide promise, so it is met on average over
tasks, not per task: for each value on a grid, the policy is replayed on every distinct training
task from its first attempt, replanning after each failure as the live router does, and the curve
records the share of those tasks completed and the money spent. The policy then runs at the least
value whose share reaches the target (``Artifact.value_for``).

The replay plans on out-of-fold probabilities (a fit that has seen a task's outcomes plans it too
well: a value chosen that way missed its target on new tasks by 5–10 points) and reads the outcome
and cost the log recorded when the task was attempted on the chosen model; a model the log has
not seen on the task contributes its expected success and cost instead. A log that tried every
model on every task (``router eval``) is replayed exactly; a live log mixes the two.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from router.features.task import vector as taskfeatures
from router.policy.learned import Artifact, LearnedScorer, Objective
from router.policy.plan import REPEAT_FACTOR, Option, outcomes_by_value

#: USD per completed task, geometric from a tenth of a cent to $1000 (about 26% apart).
GRID = np.geomspace(1e-3, 1e3, 61)
#: Curves are written for these retry limits (and the policy's own).
ATTEMPTS = (1, 2, 3)


@dataclass(frozen=True, slots=True)
class Logged:
    """A task's first attempt on one model, as the log has it."""

    p_success: float  # out of fold
    success: bool
    cost: float


def curve(
    artifact: Artifact, tasks: Sequence[Mapping[str, Logged]], vectors: Sequence[Mapping[int, float]], *,
    max_attempts: int, grid: np.ndarray = GRID,
) -> list[list[float]]:  # fmt: skip
    """``[[value, share of tasks completed, cost per task], ...]`` over ``grid``."""
    scorer = LearnedScorer(artifact, Objective(max_attempts=max_attempts))
    models = list(artifact.models)
    success = np.zeros(len(grid))
    cost = np.zeros(len(grid))
    for logged, vec in zip(tasks, vectors, strict=True):
        opts = [
            Option(o.model, logged[o.model].p_success if o.model in logged else o.p_success, o.attempt_cost)
            for o in scorer.options(taskfeatures.with_attempt(vec, 1), models)
        ]
        s, c = _replay(opts, logged, grid, max_attempts, artifact.task_sd)
        success += s
        cost += c
    n = max(len(vectors), 1)
    return [[round(float(v), 6), round(float(s / n), 5), round(float(c / n), 6)] for v, s, c in
            zip(grid, success, cost, strict=True)]  # fmt: skip


def _replay(
    opts: Sequence[Option], logged: Mapping[str, Logged], grid: np.ndarray, max_attempts: int, task_sd: float
) -> tuple[np.ndarray, np.ndarray]:
    """One task at every value: (chance completed, expected spend). The states are the failures
    seen so far, each with its probability per value (1 or 0 where the log decides every step)."""
    by_model = {o.model: o for o in opts}
    success, spent = np.zeros(len(grid)), np.zeros(len(grid))
    states: dict[tuple[str, ...], np.ndarray] = {(): np.ones(len(grid))}
    for attempt in range(1, max_attempts + 1):
        nxt: dict[tuple[str, ...], np.ndarray] = defaultdict(lambda: np.zeros(len(grid)))
        for failed, weight in states.items():
            _, _, first = outcomes_by_value(
                opts, grid, attempts_left=max_attempts - attempt + 1, task_sd=task_sd, already_failed=failed
            )
            for j, model in enumerate(first):
                if model is None or weight[j] == 0:
                    continue
                repeat, seen = model in failed, logged.get(model)
                if seen is not None:  # a repeat repeats the recorded failure
                    ok, c = (0.0 if repeat else float(seen.success)), seen.cost
                else:
                    o = by_model[model]
                    ok, c = o.p_success * (REPEAT_FACTOR if repeat else 1.0), o.attempt_cost
                spent[j] += weight[j] * c
                success[j] += weight[j] * ok
                nxt[failed if repeat else (*failed, model)][j] += weight[j] * (1.0 - ok)
        states = nxt
    return success, spent


def curves(
    artifact: Artifact, tasks: Sequence[Mapping[str, Logged]], vectors: Sequence[Mapping[int, float]],
    attempts: Iterable[int] = ATTEMPTS,
) -> dict[str, list[list[float]]]:  # fmt: skip
    return {str(k): curve(artifact, tasks, vectors, max_attempts=k) for k in sorted(set(attempts))}
