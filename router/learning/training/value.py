"""Operating points from the training log: for each value (and target), the prior plan, the margin
a task must clear to leave it, and what the policy is expected to complete and spend.

The prior plan at a value is the fixed order worth most on the training log; at a target, the one
with the least cost per completed task among those reaching it (``router.policy.prior``), reaching
it with the margin, and among orders as long, an inner cross-validation on the training tasks says
it needs to reach it on new ones (``router.learning.training.prior.margins``). A target
is a fleet-wide promise, met on average over tasks, not per task; the value a target stands for is
the least one at which the frontier's best order reaches it.

Whether per-task deviations pay is measured, not assumed: every distinct training task is replayed
from its first attempt at every operating point and every margin in ``MARGINS`` at once, replanning
after each failure as the live router does, with the per-task plans made on out-of-fold
probabilities (a fit that has seen a task's outcomes plans it too well: a value chosen that way
missed its target on new tasks by 5–10 points) and the outcome and cost the log recorded when the
task was attempted on the chosen model (a model the log has not seen on the task contributes its
expected success and cost). The margin kept is the one worth most on that replay; the prior plan
alone (an infinite margin) wins ties and whenever no margin gained. The prior plan was chosen on
the same tasks, so the comparison leans towards it: a deviation is kept only where it pays anyway.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from router.features.task import vector as taskfeatures
from router.policy import prior as priors
from router.policy.artifact import Artifact
from router.policy.learned import LearnedScorer, Objective
from router.policy.plan import REPEAT_FACTOR, Option, evaluate, outcomes_by_value

#: USD per completed task, geometric from a tenth of a cent to $1000 (about 26% apart).
GRID = np.geomspace(1e-3, 1e3, 61)
#: Operating points are written for these retry limits (and the policy's own).
ATTEMPTS = (1, 2, 3)
#: Success targets given their own operating point (and the policy's own target).
TARGETS = tuple(round(0.05 * i, 2) for i in range(1, 20))
#: A task leaves the prior plan when its own plan is worth more by this share of the value.
MARGINS = (0.0, 0.01, 0.03, 0.1, 0.3, math.inf)
#: A margin's gain over the prior plan must exceed this many standard errors (over tasks) to count.
SIGNIFICANCE = 2.0


@dataclass(frozen=True, slots=True)
class Logged:
    """A task's first attempt on one model, as the log has it."""

    p_success: float  # out of fold
    success: bool
    cost: float


@dataclass(frozen=True, slots=True)
class _Op:
    value: float
    target: float | None
    prior: tuple[str, ...]


#: target → (how far above it, the longest order) the prior plan is chosen at (``Point.above``).
Above = Mapping[float, tuple[float, int | None]]


def points(
    artifact: Artifact, tasks: Sequence[Mapping[str, Logged]], vectors: Sequence[Mapping[int, float]],
    frontiers: Mapping[int, Sequence[priors.FixedPlan]], *, max_attempts: int,
    noise: tuple[float, float] = (0.0, 0.0), targets: Iterable[float] = TARGETS, above: Above | None = None,
) -> list[priors.Point]:  # fmt: skip
    """One point per value in ``GRID`` and per target, each with the margin worth most on the replay.
    ``frontiers``: per retry limit (``max_attempts``' and the shorter ones a target's plan may be
    limited to); ``above``: where each target's prior plan is chosen (absent: at the target)."""
    frontier = frontiers[max_attempts]
    ops = [_Op(float(v), None, priors.for_value(frontier, float(v)).models) for v in GRID]
    chosen = {}
    for t in sorted(set(targets)):
        a, longest = (above or {}).get(t, (0.0, None))
        among, level = priors.for_target_above(frontiers, max_attempts, t, a, longest)
        ops.append(_Op(priors.value_of_target(among, level), t, priors.for_target(among, level).models))
        chosen[t] = (a, longest)
    scorer = LearnedScorer(artifact, Objective(max_attempts=max_attempts))
    models = list(artifact.models)
    per_task = []
    for logged, vec in zip(tasks, vectors, strict=True):
        opts = [
            Option(o.model, logged[o.model].p_success if o.model in logged else o.p_success, o.attempt_cost)
            for o in scorer.options(taskfeatures.with_attempt(vec, 1), models)
        ]
        per_task.append(_replay(opts, logged, ops, max_attempts, artifact.task_sd, noise))
    runs = np.array(per_task).reshape(len(per_task), 4, len(ops), len(MARGINS))
    success, cost, decisions, deviations = (
        runs.mean(axis=0) if len(per_task) else np.zeros((4, len(ops), len(MARGINS)))
    )
    values = np.array([op.value for op in ops])[:, None]
    # Each task's worth at each margin, beside its worth under the prior plan alone (the last).
    gained = values * (runs[:, 0] - runs[:, 0, :, -1:]) - (runs[:, 1] - runs[:, 1, :, -1:])
    n = max(len(per_task), 1)
    mean = gained.mean(axis=0) if len(per_task) else np.zeros((len(ops), len(MARGINS)))
    se = gained.std(axis=0) / np.sqrt(n) if len(per_task) > 1 else np.full((len(ops), len(MARGINS)), np.inf)
    out = []
    for i, op in enumerate(ops):
        # A margin is kept only where its gain is clear of the replay's noise (two standard
        # errors over the tasks); otherwise, and on ties, the prior plan alone (the last margin).
        clear = [
            j for j in range(len(MARGINS) - 1) if mean[i, j] > SIGNIFICANCE * se[i, j] and mean[i, j] > 0
        ]
        j = max(clear, key=lambda m: (mean[i, m], m)) if clear else len(MARGINS) - 1
        a, longest = chosen[op.target] if op.target is not None else (0.0, None)
        out.append(
            priors.Point(
                op.value,
                op.target,
                MARGINS[j],
                float(success[i, j]),
                float(cost[i, j]),
                float(deviations[i, j] / decisions[i, j]) if decisions[i, j] else 0.0,
                float(mean[i, j]),
                a,
                longest,
            )
        )
    return out


def _replay(
    opts: Sequence[Option], logged: Mapping[str, Logged], ops: Sequence[_Op], max_attempts: int,
    task_sd: float, noise: tuple[float, float],
) -> np.ndarray:  # fmt: skip
    """One task at every operating point × margin: (chance completed, expected spend, decisions,
    deviations). The states are the failures seen so far and whether the last attempt's result was
    right (a rejected right one), each with its weight per column.

    As ``router eval`` replays a task (``router.learning.evals.simulate``): an accepted result
    ends the task; a rejected one goes on, and when nothing comes after it (the last attempt, or
    the plan stops) the task ends with it, so a right result rejected there counts as done. A
    repeat of a model the log saw on the task repeats its recorded outcome with a fresh verdict."""
    by_model = {o.model: o for o in opts}
    index = {o.model: i for i, o in enumerate(opts)}
    names = [o.model for o in opts]
    values = np.array([op.value for op in ops])
    margins = np.array(MARGINS)
    fa, fr = noise
    shape = (len(ops), len(MARGINS))
    out = np.zeros((4, *shape))
    states: dict[tuple[tuple[str, ...], bool], np.ndarray] = {((), False): np.ones(shape)}
    for attempt in range(1, max_attempts + 1):
        left = max_attempts - attempt + 1
        nxt: dict[tuple[tuple[str, ...], bool], np.ndarray] = defaultdict(lambda: np.zeros(shape))
        for (failed, last_right), weight in states.items():
            s_best, c_best, first = outcomes_by_value(
                opts, values, attempts_left=left, task_sd=task_sd, already_failed=failed, noise=noise
            )
            best_worth = values * s_best - c_best
            best_model = np.array([-1 if m is None else index[m] for m in first])
            failed_opts = [by_model[m] for m in failed]
            rest_worth, rest_model = np.zeros(len(ops)), np.full(len(ops), -1)
            kept: dict[tuple[str, ...], tuple[float, float]] = {}
            for i, op in enumerate(ops):
                rest = tuple(priors.remainder(op.prior, failed, names, left))
                if not rest:
                    continue
                if rest not in kept:
                    p = evaluate([by_model[m] for m in rest], failed_opts, task_sd, noise)
                    kept[rest] = (p.success, p.expected_cost)
                s, c = kept[rest]
                rest_worth[i], rest_model[i] = op.value * s - c, index[rest[0]]
            leave = (best_worth - rest_worth)[:, None] > margins[None, :] * values[:, None]
            chosen = np.where(leave, best_model[:, None], rest_model[:, None])
            out[2] += weight
            out[3] += weight * leave
            if last_right:  # stopping here leaves the rejected right result in place
                out[0] += np.where(chosen < 0, weight, 0.0)
            for k in np.unique(chosen[(chosen >= 0) & (weight > 0)]):
                model = names[k]
                w = np.where(chosen == k, weight, 0.0)
                repeat, seen = model in failed, logged.get(model)
                if seen is not None:  # a repeat repeats the recorded outcome
                    ok, c = float(seen.success), seen.cost
                else:
                    o = by_model[model]
                    ok, c = o.p_success * (REPEAT_FACTOR if repeat else 1.0), o.attempt_cost
                out[1] += w * c
                out[0] += w * ok * (1.0 - fr)
                after = failed if repeat else (*failed, model)
                nxt[after, True] += w * ok * fr
                nxt[after, False] += w * (1.0 - ok) * (1.0 - fa)
        states = nxt
    for (_, last_right), weight in states.items():
        if last_right:  # the last attempt's right result stands whatever the verdict
            out[0] += weight
    return out


def all_points(
    artifact: Artifact, tasks: Sequence[Mapping[str, Logged]], vectors: Sequence[Mapping[int, float]],
    frontiers: Mapping[int, Sequence[priors.FixedPlan]], *, noise: tuple[float, float] = (0.0, 0.0),
    targets: Iterable[float] = TARGETS, above: Mapping[int, Above] | None = None,
) -> dict[int, tuple[priors.Point, ...]]:  # fmt: skip
    """The artifact's operating points per retry limit, rounded as it keeps them (``above``: per
    retry limit, where each target's prior plan is chosen)."""
    targets, above = tuple(targets), above or {}

    def at(k: int) -> list[priors.Point]:
        return points(artifact, tasks, vectors, frontiers, max_attempts=k, noise=noise, targets=targets,
                      above=above.get(k))  # fmt: skip

    return {k: tuple(rounded(p) for p in at(k)) for k in sorted(frontiers)}


def rounded(p: priors.Point) -> priors.Point:
    """6 decimals for dollars, 5 for the success, 4 for shares (what a file needs, not float noise)."""
    return priors.Point(
        round(p.value, 6), p.target, p.margin, round(p.success, 5), round(p.cost, 6), round(p.deviations, 4),
        round(p.gain, 6), p.above, p.longest,
    )  # fmt: skip
