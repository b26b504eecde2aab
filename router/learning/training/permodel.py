"""Per-model task terms: each model's own weights on the task features, shrunk towards the shared score.

The shared difficulty score (``pooled``) says how hard a task is for every model alike; two
near-equal models differ on which tasks they solve, and only a model's own weights can say so.
Each model gets ``logit p = a + b · shared(x) + d · x``: a level, a slope on the shared score and a
deviation ``d`` with a stronger L2 penalty (strength ``1 / c``), so a model with little data stays
close to the shared score. ``c`` is one for all models, chosen by cross-validation grouped by task
from a grid that includes "no deviation" (0), so deviations are kept only where they predict.

A deviation lives in the span of the task matrix's leading directions (a truncated SVD of the
distinct tasks, ``RANK`` of them): a few hundred tasks per model cannot support thousands of free
weights anyway, and a fit over ``RANK`` columns takes milliseconds where the full width took seconds
per model. It is exported over the task features (``directions @ d``), so the artifact and the
decision read it as any other weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse, special
from sklearn.decomposition import TruncatedSVD
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold

#: Directions of the task matrix a deviation may use.
RANK = 32
#: Deviation strengths tried (0: the shared score only); the best out-of-fold log loss wins.
C_GRID = (0.0, 0.3, 1.0, 3.0)
#: Penalty on the slope alone (no deviations): nearly free, as the two-parameter fit had before.
LEVEL_C = 10.0
#: With deviations, the score's column is scaled by this: its slope is nearly free beside them.
SCORE_SCALE = 10.0
FOLDS = 5


@dataclass(frozen=True)
class ModelFit:
    level: float
    slope: float
    #: Deviation weights over the directions (``directions @ deviation``: over the task features).
    deviation: np.ndarray

    def logit(self, z: np.ndarray, score: np.ndarray) -> np.ndarray:
        return np.asarray(self.level + self.slope * score + z @ self.deviation)


def directions(x: sparse.csr_matrix, groups: np.ndarray) -> np.ndarray:
    """(width, ≤ RANK): the leading right singular vectors of the distinct tasks' rows."""
    _, first = np.unique(groups, return_index=True)
    tasks = x[first]
    k = min(RANK, tasks.shape[0] - 1, tasks.shape[1] - 1)
    if k < 1:
        return np.zeros((x.shape[1], 0))
    svd = TruncatedSVD(n_components=k, random_state=0).fit(tasks)
    return np.asarray(svd.components_.T)


def fit_one(
    z: np.ndarray, score: np.ndarray, y: np.ndarray, c: float, w: np.ndarray | None = None
) -> ModelFit:
    """The penalised maximum-likelihood level, slope and deviation (in the directions' space ``z``).

    One logistic regression over [shared score, z] with an unpenalised intercept: the score's
    column is scaled up by ``SCORE_SCALE`` so that its slope is penalised ``SCORE_SCALE²`` times
    less than a deviation (the usual way to give one column its own penalty in a solver that has one).
    ``w``: each row's weight (an inferred label counts by its confidence).
    """
    k = z.shape[1]
    if len(np.unique(y)) < 2:
        level = float(np.log((y.sum() + 1) / (len(y) - y.sum() + 1)))
        return ModelFit(level, 0.0, np.zeros(k))
    s = score.reshape(-1, 1) * SCORE_SCALE
    if c <= 0 or k == 0:
        lr = LogisticRegression(C=LEVEL_C).fit(s, y, sample_weight=w)
        return ModelFit(float(lr.intercept_[0]), float(lr.coef_[0][0]) * SCORE_SCALE, np.zeros(k))
    lr = LogisticRegression(C=c, max_iter=1000).fit(np.hstack([s, z]), y, sample_weight=w)
    coef = lr.coef_[0]
    return ModelFit(float(lr.intercept_[0]), float(coef[0]) * SCORE_SCALE, coef[1:].copy())


def choose_strength(
    z: np.ndarray, score: np.ndarray, y: np.ndarray, model_of: np.ndarray, groups: np.ndarray,
    w: np.ndarray, grid: Sequence[float] = C_GRID,
) -> tuple[float, np.ndarray]:  # fmt: skip
    """The deviation strength with the least out-of-fold log loss over every model's rows, and the
    out-of-fold probabilities at that strength (for the metrics ``router train`` prints)."""
    n_groups = len(np.unique(groups))
    if n_groups < 2:
        return 0.0, np.full(len(y), y.mean() if len(y) else 0.5)
    folds = list(GroupKFold(min(FOLDS, n_groups)).split(z, y, groups))
    best: tuple[float, float, np.ndarray] | None = None
    for c in grid:
        oof = np.full(len(y), float(y.mean()))
        for train, test in folds:
            for m in np.unique(model_of[test]):
                tr, te = train[model_of[train] == m], test[model_of[test] == m]
                if len(tr) == 0:
                    continue
                f = fit_one(z[tr], score[tr], y[tr], c, w[tr])
                oof[te] = special.expit(f.logit(z[te], score[te]))
        q = np.clip(oof, 1e-6, 1 - 1e-6)
        logloss = -float(np.sum(w * (y * np.log(q) + (1 - y) * np.log(1 - q))))
        if best is None or logloss < best[0] - 1e-9:
            best = (logloss, c, oof)
    assert best is not None
    return best[1], best[2]
