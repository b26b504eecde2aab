"""Fitting: per model, a calibrated P(success | task) and a model of an attempt's cost.

Difficulty is learned once from every model's attempts (``pooled``: a shared linear score of the
task features); each model then gets its own level and slope on that score and its own task terms
shrunk towards it (``permodel``), fitted on out-of-fold scores so the probabilities the planner
multiplies are honest. Its weights are exported over the task features (slope × shared weights +
its deviation, level on the bias). When the log is too small for a shared score, each model gets an
L2-regularised logistic regression of its own, Platt-calibrated on cross-validated scores.
A ridge regression of log attempt cost on the task's shape features gives each model's cost;
models with too little data fall back to smoothed rates. How much one task's outcomes go
together beyond its features (``taskeffect``) is stored for the planner's retries.
"""

from __future__ import annotations

import dataclasses
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
from threadpoolctl import threadpool_limits

from router.features.task.vector import HASH_DIM, NUMERIC, Vector
from router.learning.training import permodel, pooled, prior, quality, taskeffect, value
from router.learning.training import scopes as scoped
from router.learning.training.dataset import AttemptRow
from router.policy.artifact import Artifact, ModelParams
from router.policy.config import Scope

MIN_ROWS_FOR_MODEL = 8


def _smoothed_logit(successes: float, n: float) -> float:
    p = (successes + 1) / (n + 2)
    return math.log(p / (1 - p))


def fit_model(
    rows: Sequence[AttemptRow], c: float = 0.5,
    shared: tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray] | None = None,
) -> tuple[ModelParams, np.ndarray]:  # fmt: skip
    """Parameters for one model and its out-of-fold probabilities (for calibration metrics).

    ``shared`` is (shared weights, these rows' out-of-fold shared scores, the deviations'
    directions, their strength, these rows' out-of-fold probabilities at it), when there is one.
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
        shared_weights, score, basis, c_dev, oof = shared
        own = permodel.fit_one(np.asarray(x @ basis), score, y, c_dev, w)
        weights = own.slope * shared_weights + basis @ own.deviation
        weights[0] += own.level
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
        weights[0] = _smoothed_logit(float(w @ y), float(w.sum()))  # weighted, as the fits above
        oof = np.full(n, 1 / (1 + math.exp(-weights[0])))
    costs = np.array([max(r.cost, 1e-6) for r in rows])
    dense_numeric = x[:, : len(NUMERIC)].toarray()
    if n >= 3:
        ridge = Ridge(alpha=1.0, fit_intercept=False).fit(dense_numeric, np.log(costs))
        cost_weights = ridge.coef_
    else:
        cost_weights = np.zeros(len(NUMERIC))
        cost_weights[0] = float(np.log(costs).mean())
    # Rounded as the artifact is written, so the value training goes on with is the one the file holds.
    params = ModelParams(
        weights=tuple(round(float(w), 6) for w in weights),
        platt=(round(platt[0], 6), round(platt[1], 6)),
        cost_weights=tuple(round(float(w), 6) for w in cost_weights),
        calls_per_attempt=round(float(np.mean([r.n_calls for r in rows])), 3),
        n=n,
        success_rate=round(k / n, 4),
        mean_cost=round(float(costs.mean()), 6),
    )
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


def fit(
    rows: Sequence[AttemptRow], *, c: float = 0.5, max_attempts: int | None = None,
    target: float | None = None, noise: tuple[float, float] = (0.0, 0.0),
    scopes: Sequence[Scope] = (), min_scope_attempts: int = scoped.MIN_ATTEMPTS,
) -> Artifact:  # fmt: skip
    """The artifact for these attempt rows, with prior plans and operating
    points for the retry limits in ``value.ATTEMPTS`` and ``max_attempts`` (and ``target`` among
    the targets measured; ``noise`` is the (false accept, false reject) of the verifier outcomes
    will be learned through), and the effects of the policy's ``scopes`` that improve held-out log
    loss (``scope_report`` says, per scope, why kept or not)."""
    if not rows:
        raise ValueError("no labelled attempts in the log: send traffic and outcomes first")
    # Many small fits: BLAS threads only contend, badly so on a small shared machine.
    with threadpool_limits(1):
        artifact, p, groups = _fit(rows, c, max_attempts, target, noise)
    if scopes:
        # On the out-of-fold probabilities: offsets fitted to in-sample ones would learn nothing.
        results = scoped.fit_scopes(scopes, rows, p, groups, min_attempts=min_scope_attempts)
        artifact = dataclasses.replace(
            artifact,
            scopes=scoped.to_artifact(scopes, results),
            report={**artifact.report, "scope_report": [r.as_dict() for r in results]},
        )
    return artifact


def _fit(
    rows: Sequence[AttemptRow], c: float, max_attempts: int | None, target: float | None,
    noise: tuple[float, float],
) -> tuple[Artifact, np.ndarray, np.ndarray]:  # fmt: skip
    x = matrix(rows)
    groups = pooled.task_groups(rows)
    shared = pooled.shared_score(rows, x, groups)
    per_model: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        per_model[r.model].append(i)
    y = np.array([r.success for r in rows], dtype=np.float64)
    c_dev, dev_oof, basis = 0.0, np.zeros(len(rows)), np.zeros((x.shape[1], 0))
    if shared.c is not None:
        names = sorted(per_model)
        model_of = np.array([names.index(r.model) for r in rows])
        basis = permodel.directions(x, groups)
        w = np.array([r.weight for r in rows], dtype=np.float64)
        c_dev, dev_oof = permodel.choose_strength(np.asarray(x @ basis), shared.oof, y, model_of, groups, w)
    models: dict[str, ModelParams] = {}
    p = np.zeros(len(rows))
    for model, idx in sorted(per_model.items()):
        given = (
            (shared.weights, shared.oof[idx], basis, c_dev, dev_oof[idx]) if shared.c is not None else None
        )
        params, oof = fit_model([rows[i] for i in idx], c=c, shared=given)
        models[model] = params
        p[idx] = oof
    task_sd = taskeffect.estimate(groups, p, y)
    # The operating points are the policy's own expectations: measured with the artifact's models.
    fitted = Artifact(models=models, task_sd=task_sd, report=_report(rows, p, y, groups, shared.c, c_dev))
    first: dict[int, Vector] = {}
    seen: dict[int, dict[str, value.Logged]] = defaultdict(dict)
    for g, r, p_oof in zip(groups, rows, p, strict=True):
        first.setdefault(int(g), r.vector)
        if r.attempt == 1:
            seen[int(g)].setdefault(r.model, value.Logged(float(p_oof), r.success, r.cost))
    attempts = {*value.ATTEMPTS, *([max_attempts] if max_attempts else [])}
    frontiers = prior.frontiers(
        prior.orders(rows, groups, min(max(attempts), prior.MAX_LEN), noise), attempts
    )
    order = sorted(first)
    targets = {*value.TARGETS, *([target] if target is not None else [])}
    # Each target's prior plan at the margin above it the training tasks' inner cross-validation keeps.
    above = prior.margins(rows, groups, attempts, targets, noise)
    points = value.all_points(
        fitted, [seen[g] for g in order], [first[g] for g in order], frontiers, noise=noise, targets=targets,
        above=above,
    )  # fmt: skip
    artifact = dataclasses.replace(
        fitted, frontiers=prior.rounded(frontiers), points=points, noise=(float(noise[0]), float(noise[1]))
    )
    return artifact, p, groups


def _report(
    rows: Sequence[AttemptRow], p: np.ndarray, y: np.ndarray, groups: np.ndarray, c_shared: float | None,
    c_dev: float,
) -> dict[str, Any]:  # fmt: skip
    """What the fit measured, for people (``router train`` prints it; evaluations report it)."""
    return {
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
            "auc": quality.auc(p, y),
            "pairwise": quality.pairwise(p, y, groups, [r.model for r in rows]),
            "reliability": reliability(p, y),
        },
        "shared_score": {"c": c_shared, "deviation_c": c_dev},
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for i in items:
        out[i] += 1
    return out
