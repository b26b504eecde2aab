"""A difficulty score shared by every model, learned from all their attempts at once.

What makes a task hard is mostly the same for every model, and a log has many attempts in all but
few per model: one L2-regularised logistic regression over every attempt (task features plus one
intercept per model) learns a linear score of the task features, and each model then only needs
its own intercept and slope on that score. The score's strength is chosen by cross-validation
grouped by task, and out-of-fold scores are returned so the per-model slopes are fitted on scores
the rows did not help make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold

from router.features.task.vector import NUMERIC
from router.learning.training.dataset import AttemptRow

#: Inverse regularisation strengths tried; the best out-of-fold log loss wins.
C_GRID = (0.02, 0.05, 0.2)
FOLDS = 5
#: Fewer distinct tasks than this and the score is left at zero (intercepts only).
MIN_TASKS = 10
_ATTEMPT = NUMERIC.index("attempt")


@dataclass(frozen=True)
class SharedScore:
    #: Full-width weights over the task features; the score of a task is ``weights · x``.
    weights: np.ndarray
    #: Each row's score from a fit that did not see the row's task.
    oof: np.ndarray
    c: float | None


def task_key(vec: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """The identity of a task's opening request: its features without the attempt number."""
    return tuple(sorted((i, round(v, 6)) for i, v in vec.items() if i != _ATTEMPT))


def task_groups(rows: Sequence[AttemptRow]) -> np.ndarray:
    """A group number per row: rows of the same task (the same opening request) share one."""
    ids: dict[tuple[tuple[int, float], ...], int] = {}
    return np.array([ids.setdefault(task_key(r.vector), len(ids)) for r in rows], dtype=int)


def shared_score(rows: Sequence[AttemptRow], x: sparse.csr_matrix, groups: np.ndarray) -> SharedScore:
    """``groups``: ``task_groups(rows)``."""
    width = x.shape[1]
    y = np.array([r.success for r in rows], dtype=int)
    n_tasks = int(groups.max()) + 1 if len(groups) else 0
    if n_tasks < MIN_TASKS or y.min() == y.max():
        return SharedScore(np.zeros(width), np.zeros(len(rows)), None)
    models = sorted({r.model for r in rows})
    col = {m: i for i, m in enumerate(models)}
    onehot = sparse.csr_matrix(
        (np.ones(len(rows)), (np.arange(len(rows)), [col[r.model] for r in rows])),
        shape=(len(rows), len(models)),
    )
    xx = sparse.hstack([x, onehot], format="csr")
    folds = list(GroupKFold(min(FOLDS, n_tasks)).split(xx, y, groups))
    best: tuple[float, float, np.ndarray] | None = None
    for c in C_GRID:
        oof = np.zeros(len(rows))
        logloss = 0.0
        for train, test in folds:
            if y[train].min() == y[train].max():
                continue
            clf = LogisticRegression(C=c, fit_intercept=False, max_iter=3000).fit(xx[train], y[train])
            p = np.clip(clf.predict_proba(xx[test])[:, 1], 1e-6, 1 - 1e-6)
            logloss -= float(np.sum(y[test] * np.log(p) + (1 - y[test]) * np.log(1 - p)))
            oof[test] = x[test] @ clf.coef_[0][:width]
        if best is None or logloss < best[0]:
            best = (logloss, c, oof)
    assert best is not None
    _, c, oof = best
    clf = LogisticRegression(C=c, fit_intercept=False, max_iter=3000).fit(xx, y)
    return SharedScore(clf.coef_[0][:width].copy(), oof, c)
