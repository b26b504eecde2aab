"""Fitting: per model, a calibrated P(success | task) and a model of an attempt's cost.

Difficulty is learned once from every model's attempts (``pooled``: a shared linear score of the
task features); each model then gets its own intercept and slope on that score, fitted on
out-of-fold scores so the probabilities the planner multiplies are honest. Its weights are
exported over the task features as before (slope × shared weights, intercept on the bias), so
the artifact reads the same. When the log is too small for a shared score, each model gets an
L2-regularised logistic regression of its own, Platt-calibrated on cross-validated scores.
A ridge regression of log attempt cost on the task's shape features gives each model's cost;
models with too little data fall back to smoothed rates. How much one task's outcomes go
together beyond its features (``taskeffect``) is stored for the planner's retries.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import sparse
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from router.features.task.vector import HASH_DIM, NUMERIC, schema
from router.learning.training import pooled, taskeffect
from router.learning.training.dataset import AttemptRow
from router.policy.learned import FORMAT

MIN_ROWS_FOR_MODEL = 8


def _smoothed_logit(successes: float, n: float) -> float:
    p = (successes + 1) / (n + 2)
    return math.log(p / (1 - p))


def fit_model(
    rows: Sequence[AttemptRow], c: float = 0.5, shared: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[dict[str, Any], np.ndarray]:
    """Parameters for one model and its out-of-fold probabilities (for calibration metrics).

    ``shared`` is (shared weights, these rows' out-of-fold shared scores), when there is one.
    """
    width = len(NUMERIC) + HASH_DIM
    y = np.array([r.success for r in rows], dtype=int)
    # Inferred labels count by their confidence; explicit outcomes fully (dataset.label_weight).
    w = np.array([r.weight for r in rows], dtype=np.float64)
    x = matrix(rows)
    n, k = len(rows), int(y.sum())
    weights = np.zeros(width)
    platt = (1.0, 0.0)
    if n >= MIN_ROWS_FOR_MODEL and 2 <= k <= n - 2 and shared is not None:
        shared_weights, score = shared
        # Two parameters per model: its level and how much the shared difficulty moves it.
        lr = LogisticRegression(C=10.0).fit(score.reshape(-1, 1), y, sample_weight=w)
        slope, level = float(lr.coef_[0][0]), float(lr.intercept_[0])
        weights = slope * shared_weights
        weights[0] += level
        oof = lr.predict_proba(score.reshape(-1, 1))[:, 1]
    elif n >= MIN_ROWS_FOR_MODEL and 2 <= k <= n - 2:
        # The bias is feature 0, so no separate intercept: the weights then carry everything.
        clf = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
        folds = min(5, k, n - k)
        scores = cross_val_predict(
            clf, x, y, cv=StratifiedKFold(folds, shuffle=True, random_state=0), method="decision_function",
            params={"sample_weight": w},
        )  # fmt: skip
        cal = LogisticRegression(C=100.0).fit(scores.reshape(-1, 1), y, sample_weight=w)
        platt = (float(cal.coef_[0][0]), float(cal.intercept_[0]))
        oof = cal.predict_proba(scores.reshape(-1, 1))[:, 1]
        weights = clf.fit(x, y, sample_weight=w).coef_[0]
    else:
        weights[0] = _smoothed_logit(k, n)
        oof = np.full(n, 1 / (1 + math.exp(-weights[0])))
    costs = np.array([max(r.cost, 1e-6) for r in rows])
    dense_numeric = x[:, : len(NUMERIC)].toarray()
    if n >= 3:
        ridge = Ridge(alpha=1.0, fit_intercept=False).fit(dense_numeric, np.log(costs))
        cost_weights = ridge.coef_
    else:
        cost_weights = np.zeros(len(NUMERIC))
        cost_weights[0] = float(np.log(costs).mean())
    params = {
        "weights": [round(float(w), 6) for w in weights],
        "platt": [round(platt[0], 6), round(platt[1], 6)],
        "cost_weights": [round(float(w), 6) for w in cost_weights],
        "calls_per_attempt": round(float(np.mean([r.n_calls for r in rows])), 3),
        "n": n,
        "success_rate": round(k / n, 4),
        "mean_cost": round(float(costs.mean()), 6),
    }
    return params, oof


def matrix(rows: Sequence[AttemptRow]) -> sparse.csr_matrix:
    """The rows' task vectors as a sparse matrix: the hashed text is sparse, and dense solvers
    are far slower on it (and oversubscribe BLAS threads on small machines)."""
    width = len(NUMERIC) + HASH_DIM
    indptr, indices, values = [0], [], []
    for r in rows:
        for i, v in sorted(r.vector.items()):
            indices.append(i)
            values.append(v)
        indptr.append(len(indices))
    return sparse.csr_matrix((values, indices, indptr), shape=(len(rows), width), dtype=np.float64)


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 5) -> list[dict[str, Any]]:
    edges = np.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in itertools.pairwise(edges):
        mask = (p >= lo) & ((p < hi) if hi < 1 else (p <= hi))
        if mask.any():
            out.append({"bin": f"{lo:.1f}-{hi:.1f}", "n": int(mask.sum()),
                        "predicted": round(float(p[mask].mean()), 3), "observed": round(float(y[mask].mean()), 3)})  # fmt: skip
    return out


def fit(rows: Sequence[AttemptRow], *, c: float = 0.5) -> dict[str, Any]:
    """The artifact (a JSON-ready dict) for these attempt rows."""
    if not rows:
        raise ValueError("no labelled attempts in the log: send traffic and outcomes first")
    shared = pooled.shared_score(rows, matrix(rows))
    per_model: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        per_model[r.model].append(i)
    models: dict[str, Any] = {}
    p = np.zeros(len(rows))
    for model, idx in sorted(per_model.items()):
        given = (shared.weights, shared.oof[idx]) if shared.c is not None else None
        params, oof = fit_model([rows[i] for i in idx], c=c, shared=given)
        models[model] = params
        p[idx] = oof
    y = np.array([r.success for r in rows], dtype=np.float64)
    task_sd = taskeffect.estimate(pooled.task_groups(rows), p, y)
    return {
        "format": FORMAT,
        "feature_schema": schema(),
        "trained_at": time.time(),
        "data": {
            "attempts": len(rows),
            "tasks": len({r.task_id for r in rows}),
            "from_ts": min(r.ts for r in rows),
            "to_ts": max(r.ts for r in rows),
            "labels": dict(sorted(_count(r.label_source for r in rows).items())),
        },
        "metrics": {
            "brier": round(float(np.mean((p - y) ** 2)), 4),
            "brier_base_rate": round(float(np.mean((y.mean() - y) ** 2)), 4),
            "reliability": reliability(p, y),
        },
        "shared_score": {"c": shared.c},
        "task_effect_sd": task_sd,
        "models": models,
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for i in items:
        out[i] += 1
    return out
