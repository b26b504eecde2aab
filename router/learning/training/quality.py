"""How well the fitted probabilities tell tasks and models apart (out-of-fold, for `router train`).

Brier and calibration say whether the probabilities are right on average; AUC whether they rank
attempts by their chance of success; pairwise accuracy whether, on a task where exactly one of two
models succeeded, the model with the higher probability is the one that did. That last one is what
choosing between two near-equal models needs, and it is reported for every pair and for the close
pairs (success rates within ``CLOSE`` of each other), where the shared difficulty cannot help.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

#: Two models whose success rates in the log differ by at most this are a close pair.
CLOSE = 0.05


def auc(p: np.ndarray, y: np.ndarray) -> float | None:
    return round(float(roc_auc_score(y, p)), 4) if 0 < y.mean() < 1 else None


def pairwise(p: np.ndarray, y: np.ndarray, groups: np.ndarray, models: Sequence[str]) -> dict[str, Any]:
    """``{"all": {"accuracy", "n"}, "close": {...}}`` over (task, pair) where exactly one succeeded."""
    by_task: dict[int, dict[str, int]] = defaultdict(dict)
    for i, (g, m) in enumerate(zip(groups, models, strict=True)):
        by_task[int(g)].setdefault(m, i)  # a task's first attempt on each model
    seen: dict[str, list[float]] = defaultdict(list)
    for m, outcome in zip(models, y, strict=True):
        seen[m].append(float(outcome))
    rate = {m: float(np.mean(v)) for m, v in seen.items()}
    right = {"all": 0, "close": 0}
    total = {"all": 0, "close": 0}
    for rows in by_task.values():
        for a, b in itertools.combinations(sorted(rows), 2):
            i, j = rows[a], rows[b]
            if y[i] == y[j]:
                continue
            hit = int((p[i] > p[j]) == (y[i] > y[j]))
            for kind in ("all", "close") if abs(rate[a] - rate[b]) <= CLOSE else ("all",):
                right[kind] += hit
                total[kind] += 1
    return {
        k: {"accuracy": round(right[k] / total[k], 4) if total[k] else None, "n": total[k]} for k in total
    }
