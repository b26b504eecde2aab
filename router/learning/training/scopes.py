"""Per-scope effects: a scope's own shift of each model's success logit, shrunk towards the global fit.

A scope of the policy (``scopes:``, e.g. one repository) may be easier or harder than the log at
large, or favour some models more than the global model says. Its attempts get offsets on the
logit scale, ``logit p = global(x, m) + u + v_m``: ``u`` shared by the scope's models and ``v_m``
each model's own, both with Gaussian priors centred on zero — the global fit — (standard
deviations ``COMMON_SD`` and ``MODEL_SD``), fitted as the penalised maximum of the likelihood. A
model with few attempts in the scope thus keeps little more than the shared shift, and a scope
with little data stays near the global fit.

Whether a scope's effects predict is measured, not assumed: the global probabilities used are
out-of-fold (``fit``: from fits that never saw the attempt's task), the offsets are fitted on the
scope's tasks in ``FOLDS`` folds grouped by task and scored on the held-out ones, and the scope
keeps its effects only when its held-out log loss is below the global fit's on the same attempts.
A scope with fewer than ``MIN_ATTEMPTS`` labelled attempts or ``MIN_TASKS`` tasks is reported and
skipped. Rows are assigned to scopes as requests are at decision time: the first scope whose
match holds (``router.policy.scopes.first_scope``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special
from sklearn.model_selection import GroupKFold

from router.learning.training.dataset import AttemptRow
from router.policy.artifact import ScopeEffects
from router.policy.config import Scope
from router.policy.scopes import first_scope

#: Labelled attempts a scope needs before its effects are fitted (and tasks: the folds need them).
MIN_ATTEMPTS = 100
MIN_TASKS = 10
FOLDS = 5
#: Prior standard deviations (logit scale) of the scope's shared offset and of each model's own.
COMMON_SD = 1.0
MODEL_SD = 0.5
_EPS = 1e-6


@dataclass(frozen=True)
class Offsets:
    """A scope's effects: ``common`` for every model, plus ``models[m]`` for the models it saw."""

    common: float
    models: dict[str, float]

    def of(self, model: str) -> float:
        return self.common + self.models.get(model, 0.0)


@dataclass(frozen=True)
class ScopeResult:
    name: str
    tasks: int
    attempts: int
    kept: bool
    reason: str
    #: Held-out log loss per attempt (weighted as training weighs labels), global and with the offsets.
    loss_global: float | None = None
    loss_scoped: float | None = None
    offsets: Offsets | None = field(default=None, repr=False)

    def line(self) -> str:
        """The report line ``router train`` prints."""
        head = f"scope {self.name}: {self.tasks} tasks, {self.attempts} attempts"
        if self.loss_global is None or self.loss_scoped is None:
            return f"{head}: skipped ({self.reason})"
        verdict = "kept" if self.kept else "dropped"
        return (
            f"{head}: held-out log loss {self.loss_global:.4f} global, {self.loss_scoped:.4f} with the "
            f"scope's effects → {verdict} ({self.reason})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.name, "tasks": self.tasks, "attempts": self.attempts, "kept": self.kept,
                "reason": self.reason, "log_loss_global": _r(self.loss_global),
                "log_loss_scoped": _r(self.loss_scoped)}  # fmt: skip


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def fit_offsets(
    logit: np.ndarray, y: np.ndarray, w: np.ndarray, model_of: np.ndarray, n_models: int,
    common_sd: float = COMMON_SD, model_sd: float = MODEL_SD,
) -> tuple[float, np.ndarray]:  # fmt: skip
    """The penalised maximum-likelihood (u, v) for ``logit p_i = logit_i + u + v[model_of[i]]``.

    Newton's method on 1 + ``n_models`` parameters; the penalty makes the problem strictly convex
    (u and v alone would not be identified), so it converges in a few steps.
    """
    theta = np.zeros(1 + n_models)
    prior = np.array([1 / common_sd**2, *([1 / model_sd**2] * n_models)])
    for _ in range(50):
        eta = logit + theta[0] + theta[1:][model_of]
        p = special.expit(eta)
        r = w * (p - y)
        h = w * p * (1 - p)
        grad = np.concatenate([[r.sum()], np.bincount(model_of, r, n_models)]) + prior * theta
        hm = np.bincount(model_of, h, n_models)
        hess = np.diag(np.concatenate([[h.sum()], hm]) + prior)
        hess[0, 1:] = hess[1:, 0] = hm
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return float(theta[0]), theta[1:].copy()


def log_loss(logit: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Weighted mean log loss per attempt."""
    p = np.clip(special.expit(logit), _EPS, 1 - _EPS)
    return float(-np.sum(w * (y * np.log(p) + (1 - y) * np.log(1 - p))) / max(float(w.sum()), _EPS))


def evaluate_scope(
    name: str, rows: Sequence[AttemptRow], p_global: np.ndarray, groups: np.ndarray, *,
    min_attempts: int = MIN_ATTEMPTS, min_tasks: int = MIN_TASKS,
) -> ScopeResult:  # fmt: skip
    """Fit, measure and keep or drop one scope's effects.

    ``p_global``: each row's out-of-fold global P(success); ``groups``: each row's task group (rows
    of one task are never split between training and held-out folds).
    """
    n, tasks = len(rows), len(np.unique(groups))
    if n < min_attempts:
        return ScopeResult(name, tasks, n, False, f"too few labelled attempts: {n} < {min_attempts}")
    if tasks < min_tasks:
        return ScopeResult(name, tasks, n, False, f"too few tasks: {tasks} < {min_tasks}")
    y = np.array([r.success for r in rows], dtype=np.float64)
    w = np.array([r.weight for r in rows], dtype=np.float64)
    names = sorted({r.model for r in rows})
    model_of = np.array([names.index(r.model) for r in rows])
    base = special.logit(np.clip(p_global, _EPS, 1 - _EPS))
    scoped = base.copy()
    for train, test in GroupKFold(min(FOLDS, tasks)).split(base, y, groups):
        u, v = fit_offsets(base[train], y[train], w[train], model_of[train], len(names))
        scoped[test] = base[test] + u + v[model_of[test]]
    before, after = log_loss(base, y, w), log_loss(scoped, y, w)
    if not after < before:
        return ScopeResult(name, tasks, n, False, "no held-out improvement", before, after)
    u, v = fit_offsets(base, y, w, model_of, len(names))
    offsets = Offsets(u, {m: float(v[i]) for i, m in enumerate(names)})
    gain = (before - after) / before
    return ScopeResult(name, tasks, n, True, f"{gain:.1%} lower held-out log loss", before, after, offsets)


def fit_scopes(
    scopes: Sequence[Scope], rows: Sequence[AttemptRow], p_global: np.ndarray, groups: np.ndarray, *,
    min_attempts: int = MIN_ATTEMPTS, min_tasks: int = MIN_TASKS,
) -> list[ScopeResult]:  # fmt: skip
    """One result per declared scope, in the policy's order; each row counts for the first scope
    that matches it, as at decision time."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        s = first_scope(scopes, r.facts)
        if s is not None:
            members[s.name].append(i)
    out = []
    for s in scopes:
        idx = members.get(s.name, [])
        sub = [rows[i] for i in idx]
        out.append(evaluate_scope(s.name, sub, p_global[idx], groups[idx], min_attempts=min_attempts,
                                  min_tasks=min_tasks))  # fmt: skip
    return out


def to_artifact(scopes: Sequence[Scope], results: Sequence[ScopeResult]) -> dict[str, ScopeEffects]:
    """The artifact's ``scopes``: the kept scopes' offsets, with the match they were trained under
    (a scope whose match changed since is not given them: ``router.policy.learned``)."""
    match = {s.name: s.match.model_dump(exclude_none=True) for s in scopes}
    return {
        r.name: ScopeEffects(
            match[r.name], round(r.offsets.common, 6), {m: round(v, 6) for m, v in r.offsets.models.items()}
        )
        for r in results
        if r.kept and r.offsets is not None
    }
