"""Every fixed order of models, measured on the training log: the frontier the prior plan comes from.

An order's success and cost are chained from conditional rates read directly off the log: the
chance model B completes a task given that the models before it failed, from the tasks where those
models were all tried and failed (``router eval``'s log tried every model on every task, so this is
the exact replay of the order; a live log has it where exploration tried several models on one
task). A step measured on few tasks (under ``FULL_SUPPORT``) is shrunk towards the model's rate
over all its tasks (``SHRINK`` pseudo-tasks), and a step no task measured takes that rate. With a noisy verifier, an
attempt goes on when its result is rejected (a wrong one rightly, a right one falsely) and
completes the task when a right one is accepted, as ``router eval`` replays it; the last step's
right result completes it either way (nothing comes after it to replace it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from router.learning.training import control
from router.learning.training.dataset import AttemptRow
from router.policy.prior import FixedPlan, pareto

#: Pseudo-tasks at the model's overall rate added to a conditional step measured on few tasks.
SHRINK = 1.0
#: A step measured on at least this many (weighted) tasks is read as it is: on a full log every
#: order is then its exact replay, and the prior for a target is the best fixed cascade itself.
FULL_SUPPORT = 30.0
#: Longest order enumerated (24 models: 12k orders of three).
MAX_LEN = 3


def outcome_matrix(
    rows: Sequence[AttemptRow], groups: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(models, success, cost) per task group × model, NaN where the log has no first attempt
    (a repeat after a failure is not a fresh draw of the model on the task)."""
    models = sorted({r.model for r in rows})
    col = {m: i for i, m in enumerate(models)}
    n = int(groups.max()) + 1 if len(groups) else 0
    s_sum, c_sum, count = np.zeros((n, len(models))), np.zeros((n, len(models))), np.zeros((n, len(models)))
    for g, r in zip(groups, rows, strict=True):
        if r.model in r.failed_before:
            continue
        j = col[r.model]
        s_sum[g, j] += r.success
        c_sum[g, j] += r.cost
        count[g, j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return models, s_sum / count, c_sum / count


def orders(
    rows: Sequence[AttemptRow], groups: np.ndarray, max_len: int, noise: tuple[float, float] = (0.0, 0.0)
) -> list[FixedPlan]:
    """Every order of one to ``max_len`` distinct models, with its success and cost per task."""
    models, s, c = outcome_matrix(rows, groups)
    seen = ~np.isnan(s)
    s, c = np.nan_to_num(s), np.nan_to_num(c)
    fa, fr = noise
    done = s * (1.0 - fr)
    going = s * fr + (1.0 - s) * (1.0 - fa)
    n_seen = np.maximum(seen.sum(axis=0), 1)
    base_done, base_go = (seen * done).sum(axis=0) / n_seen, (seen * going).sum(axis=0) / n_seen
    base_cost = (seen * c).sum(axis=0) / n_seen
    base_s = (seen * s).sum(axis=0) / n_seen
    plans: list[FixedPlan] = []

    def extend(
        prefix: tuple[int, ...], weight: np.ndarray, alive: float, success: float, cost: float
    ) -> None:
        # Every next model at once: its completion, continuation and cost on the tasks still open.
        w = weight[:, None] * seen
        support = w.sum(axis=0)
        shrink = np.where(support >= FULL_SUPPORT, 0.0, SHRINK)
        total = support + shrink
        d = ((w * done).sum(axis=0) + shrink * base_done) / total
        # An order's last step: its right result stands whatever the verdict (nothing replaces it).
        d_last = ((w * s).sum(axis=0) + shrink * base_s) / total
        g = ((w * going).sum(axis=0) + shrink * base_go) / total
        k = ((w * c).sum(axis=0) + shrink * base_cost) / total
        for j in range(len(models)):
            if j in prefix:
                continue
            seq = (*prefix, j)
            c_j = cost + alive * k[j]
            plans.append(
                FixedPlan(tuple(models[i] for i in seq), float(success + alive * d_last[j]), float(c_j))
            )
            if len(seq) < max_len:
                extend(seq, weight * seen[:, j] * going[:, j], alive * g[j], success + alive * d[j], c_j)

    if models:
        extend((), np.ones(len(s)), 1.0, 0.0, 0.0)
    return plans


def frontiers(plans: Sequence[FixedPlan], lengths: Iterable[int]) -> dict[int, list[FixedPlan]]:
    """Per retry limit, the orders that fit in it and that no other such order beats."""
    return {k: pareto([p for p in plans if len(p.models) <= k]) for k in sorted(set(lengths))}


def rounded(frontier: Mapping[int, Sequence[FixedPlan]]) -> dict[int, tuple[FixedPlan, ...]]:
    """The frontiers as the artifact keeps them: 5 decimals for the success, 6 for dollars."""
    return {
        k: tuple(FixedPlan(p.models, round(p.success, 5), round(p.cost, 6)) for p in plans)
        for k, plans in frontier.items()
    }


def margins(
    rows: Sequence[AttemptRow], groups: np.ndarray, lengths: Iterable[int], targets: Iterable[float],
    noise: tuple[float, float] = (0.0, 0.0), *, seed: int = 0,
) -> dict[int, dict[float, tuple[float, int | None]]]:  # fmt: skip
    """Per retry limit and target, how far above the target and among orders of how many models
    the prior plan is chosen: the inner cross-validation ``router eval`` chooses its order with
    (``control.inner_margin``, on the same rows of task × model), on the log's tasks alone. A
    model the log has not seen on a task stands there at its rate and cost over its tasks."""
    models, s, c = outcome_matrix(rows, groups)
    seen = ~np.isnan(s)
    n_seen = np.maximum(seen.sum(axis=0), 1)
    s = np.where(seen, s, np.nan_to_num(s).sum(axis=0) / n_seen)
    c = np.where(seen, c, np.nan_to_num(c).sum(axis=0) / n_seen)
    fa, fr = noise
    tbl = control.Table(tuple(models), s, c, np.full(s.shape, 1.0 - fr), np.full(s.shape, fa))
    # A group's name is its first row's task: the folds deal tasks by name (seeded).
    names: dict[int, str] = {}
    for g, r in zip(groups.tolist(), rows, strict=True):
        names.setdefault(g, r.task_id)
    named = [names[g] for g in range(len(s))]
    memo: dict[tuple[int, bytes], control.Orders] = {}
    out: dict[int, dict[float, tuple[float, int | None]]] = {}
    for k in sorted(set(lengths)):
        out[k] = {}
        for t in sorted(set(targets)):
            m = control.inner_margin(tbl, named, None, t, min(k, MAX_LEN), seed=seed, memo=memo)
            out[k][t] = (m.margin, m.longest)
    return out
