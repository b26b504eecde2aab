"""How strongly one task's outcomes go together, beyond what its features explain.

Given each attempt's predicted success (out-of-fold), the attempts of the same task (the same
opening request, ``pooled.task_groups``) are modelled as sharing an unseen difficulty
``u ~ N(0, 1)`` that shifts every logit by ``sd · u``. ``sd`` is the maximum-likelihood value on
a grid; tasks with a single attempt carry no information about it. The planner uses it to
expect less from a retry after a failure (``router.policy.plan.conditional_success``).
"""

from __future__ import annotations

import numpy as np

from router.policy.plan import NODES

GRID = tuple(round(0.1 * i, 1) for i in range(41))
#: Fewer tasks with two or more attempts than this: assume independence.
MIN_TASKS = 10


def estimate(groups: np.ndarray, p: np.ndarray, y: np.ndarray) -> float:
    """The task-effect spread that makes these outcomes most likely (0.0 when the log cannot tell)."""
    sizes = np.bincount(groups)
    keep = sizes[groups] >= 2
    if int((sizes >= 2).sum()) < MIN_TASKS:
        return 0.0
    g = np.unique(groups[keep], return_inverse=True)[1]
    p, y = p[keep], y[keep].astype(bool)
    u, w = np.polynomial.hermite_e.hermegauss(NODES)
    log_w = np.log(w / w.sum())
    q = np.clip(p, 1e-6, 1 - 1e-6)
    logit = np.log(q / (1 - q))
    best, best_ll = 0.0, -np.inf
    for sd in GRID:
        # As plan.conditional_success, for every row at once.
        a = logit * np.sqrt(1 + np.pi * sd**2 / 8)
        cond = 1.0 / (1.0 + np.exp(-(a[:, None] + sd * u[None, :])))
        lik = np.clip(np.where(y[:, None], cond, 1.0 - cond), 1e-12, 1.0)
        per_task = np.zeros((int(g.max()) + 1, NODES))
        np.add.at(per_task, g, np.log(lik))
        ll = float(np.sum(np.logaddexp.reduce(per_task + log_w, axis=1)))
        if ll > best_ll + 1e-9:
            best, best_ll = sd, ll
    return best
