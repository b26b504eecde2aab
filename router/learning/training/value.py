"""The value of a completed task at which the policy meets a success target, from training data.

A target (``objective.target_success``) is a fleet-wide promise, so it is met on average over
tasks, not per task: for each value on a grid, the policy plans every distinct training task from
its first attempt, and the curve records the share of those tasks it expects to complete and what
it expects to spend. The policy then runs at the least value whose share reaches the target
(``Artifact.value_for``). Expectations come from calibrated probabilities, so a log that holds only
what the logging policy tried (no counterfactual outcomes) still calibrates; where a task's
attempt on a model is in the log, its out-of-fold probability is used: the fitted one has seen
that outcome, and planning on it expects several points more success than new tasks then get.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from router.features.task import vector as taskfeatures
from router.policy.learned import Artifact, LearnedScorer, Objective
from router.policy.plan import Option, outcomes_by_value

#: USD per completed task, geometric from a tenth of a cent to $1000 (about 26% apart).
GRID = np.geomspace(1e-3, 1e3, 61)
#: Curves are written for these retry limits (and the policy's own).
ATTEMPTS = (1, 2, 3)


def curve(
    artifact: Artifact, tasks: Sequence[Mapping[str, float]], vectors: Sequence[Mapping[int, float]], *,
    max_attempts: int, grid: np.ndarray = GRID,
) -> list[list[float]]:  # fmt: skip
    """``[[value, expected share completed, expected cost per task], ...]`` over ``grid``.

    ``tasks[i]`` holds task i's out-of-fold P(success) per model attempted; ``vectors[i]`` its features.
    """
    scorer = LearnedScorer(artifact, Objective(max_attempts=max_attempts))
    models = list(artifact.models)
    success = np.zeros(len(grid))
    cost = np.zeros(len(grid))
    for seen, vec in zip(tasks, vectors, strict=True):
        opts = [
            Option(o.model, seen.get(o.model, o.p_success), o.attempt_cost)
            for o in scorer.options(taskfeatures.with_attempt(vec, 1), models)
        ]
        s, c = outcomes_by_value(opts, grid, attempts_left=max_attempts, task_sd=artifact.task_sd)
        success += s
        cost += c
    n = max(len(vectors), 1)
    return [[round(float(v), 6), round(float(s / n), 5), round(float(c / n), 6)] for v, s, c in
            zip(grid, success, cost, strict=True)]  # fmt: skip


def curves(
    artifact: Artifact, tasks: Sequence[Mapping[str, float]], vectors: Sequence[Mapping[int, float]],
    attempts: Iterable[int] = ATTEMPTS,
) -> dict[str, list[list[float]]]:  # fmt: skip
    return {str(k): curve(artifact, tasks, vectors, max_attempts=k) for k in sorted(set(attempts))}
