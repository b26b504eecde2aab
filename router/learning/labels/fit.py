"""Fitting the label model, and measuring it: grouped, seeded cross-validation; AUC, Brier, reliability.

A sample is what the router knew at one request of an attempt (its feature vector) and how the
attempt ended. An attempt gives one sample per request it made, each weighted 1/requests, so a
long attempt counts once, like a short one, and the model answers at every turn, not only the
last. Folds never split a task. The logit is calibrated (Platt) on out-of-fold scores.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedGroupKFold

from router.features.labels.model import LabelModel
from router.learning.training.fit import reliability

#: The features the default model reads: few, chosen before looking at their fitted weights.
DEFAULT_FEATURES: Final = ("log_chars", "log_steps", "no_tests", "repeats")
FOLDS: Final = 5
SEED: Final = 0


@dataclass(frozen=True, slots=True)
class Sample:
    group: str
    x: Mapping[str, float]
    success: bool
    #: How much this sample counts (an attempt's samples share its weight).
    weight: float = 1.0


def _matrix(samples: Sequence[Sample], features: Sequence[str]) -> np.ndarray:
    return np.array([[float(s.x.get(f, 0.0)) for f in features] for s in samples], dtype=np.float64)


def _core(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, c: float
) -> tuple[np.ndarray, np.ndarray, LogisticRegression]:
    mean = np.average(x, axis=0, weights=w)
    scale = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=w))
    scale[scale < 1e-9] = 1.0
    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit((x - mean) / scale, y, sample_weight=w)
    return mean, scale, clf


def _folds(samples: Sequence[Sample], folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    groups = np.array([s.group for s in samples])
    y = np.array([int(s.success) for s in samples])
    k = min(folds, len(set(groups)))
    return list(StratifiedGroupKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y, groups))


def fit(
    samples: Sequence[Sample],
    features: Sequence[str] = DEFAULT_FEATURES,
    *,
    c: float = 1.0,
    folds: int = FOLDS,
    seed: int = SEED,
    meta: Mapping[str, Any] | None = None,
) -> LabelModel:
    """The model fitted on ``samples``, its Platt step on out-of-fold logits; rounded as its file
    keeps it, so the model in memory scores as the one read back."""
    y = np.array([int(s.success) for s in samples])
    if len(set(y.tolist())) < 2:
        raise ValueError("the samples need both successes and failures")
    x, w = _matrix(samples, features), np.array([s.weight for s in samples])
    oof = np.zeros(len(y))
    for train, test in _folds(samples, folds, seed):
        mean, scale, clf = _core(x[train], y[train], w[train], c)
        oof[test] = clf.decision_function((x[test] - mean) / scale)
    platt = LogisticRegression(C=1e6, max_iter=2000).fit(oof[:, None], y, sample_weight=w)
    mean, scale, clf = _core(x, y, w, c)
    return LabelModel(
        features=tuple(features),
        mean=_rounded(mean),
        scale=_rounded(scale),
        coef=_rounded(clf.coef_[0]),
        intercept=round(float(clf.intercept_[0]), 8),
        platt=(round(float(platt.coef_[0][0]), 8), round(float(platt.intercept_[0]), 8)),
        meta={"samples": len(samples), "groups": len({s.group for s in samples}), "c": c, **(meta or {})},
    )


def _rounded(values: np.ndarray) -> tuple[float, ...]:
    return tuple(round(float(v), 8) for v in values)


def cross_validate(
    samples: Sequence[Sample],
    features: Sequence[str] = DEFAULT_FEATURES,
    *,
    c: float = 1.0,
    folds: int = FOLDS,
    seed: int = SEED,
) -> np.ndarray:
    """Out-of-fold P(success) of every sample: each fold's model (calibration included) is fitted
    without the fold's tasks."""
    out = np.zeros(len(samples))
    for train, test in _folds(samples, folds, seed):
        model = fit([samples[i] for i in train], features, c=c, folds=folds, seed=seed)
        for i in test:
            out[i] = model.p_success(samples[i].x)
    return out


def per_attempt(samples: Sequence[Sample]) -> list[Sample]:
    """Samples re-weighted so that each group (attempt) counts once in total."""
    n: dict[str, int] = defaultdict(int)
    for s in samples:
        n[s.group] += 1
    return [Sample(s.group, s.x, s.success, s.weight / n[s.group]) for s in samples]


def quality(p: Sequence[float], y: Sequence[int], threshold: float = 0.5) -> dict[str, Any]:
    """How well probabilities ``p`` predict outcomes ``y``: AUC, Brier (and the constant's), agreement."""
    n = len(y)
    if n == 0:
        return {"n": 0}
    rate = sum(y) / n
    brier = sum((pi - yi) ** 2 for pi, yi in zip(p, y, strict=True)) / n
    auc = roc_auc_score(y, p) if 0 < sum(y) < n else math.nan
    agree = sum((pi >= threshold) == bool(yi) for pi, yi in zip(p, y, strict=True)) / n
    return {
        "n": n,
        "base_rate": round(rate, 4),
        "auc": None if math.isnan(auc) else round(float(auc), 4),
        "brier": round(brier, 4),
        "brier_constant": round(rate * (1 - rate), 4),
        "agreement": round(agree, 4),
        "agreement_constant": round(max(rate, 1 - rate), 4),
        "reliability": reliability(np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)),
    }
