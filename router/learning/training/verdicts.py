"""What a log of noisy verdicts says of each attempt's true outcome, read across models.

Under a verifier that accepts a wrong result with probability FA and rejects a right one with FR,
one verdict corrected by those rates, ``(v − FA) / (1 − FA − FR)``, is an unbiased estimate of the
attempt's outcome, but at 0.3, 0.2 it is twice as noisy as the outcome itself (it runs from −0.6
to 1.4). The cheapest of the 267,744 orders of four models that reaches a target on such estimates
is one whose estimate ran high: on SWE-bench it resolved 9 points less than estimated, on the very
training tasks it was chosen on (and as much less on held-out ones).

Every model's verdict on a task says something of how hard the task is, and that is what a single
run's verdict lacks. Each task has a difficulty ``b`` (on a grid; how often each value occurs is
learned), each model an ability ``a``, and an attempt is right with ``σ(a + b)``; its verdict
comes through the verifier's known error rates. Fitted by EM on the verdicts alone (the truth is
never seen). A task then becomes a few weighted rows, one per likely ``b``, each holding every
model's P(right | its verdict, b): given ``b`` the models' outcomes are independent, so an
order's chance on the task is the weighted mean over its rows, and one task's failures stay
correlated across models through ``b`` (which per-run estimates, however shrunk, lose: a cascade
would look better than it is).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from router.features.task.attempt import AttemptControl
from router.learning.training import control
from router.learning.training import margin as margins
from router.learning.training.control import Run

#: Difficulty values a task may take (logit shifts).
GRID = np.linspace(-6.0, 6.0, 25)
ITERATIONS = 200
#: A task's rows below this posterior weight are dropped (the rest renormalised).
MIN_WEIGHT = 1e-3


@dataclass(frozen=True)
class Posterior:
    #: Per task × difficulty: how likely the task is that hard, given its verdicts.
    weights: np.ndarray
    #: Per task × difficulty × model: P(the attempt was right | its verdict, that difficulty).
    right: np.ndarray
    #: Per model: its ability (logit at difficulty 0).
    ability: np.ndarray


def fit(
    verdicts: np.ndarray, noise: tuple[float, float], *, grid: np.ndarray = GRID, iterations: int = ITERATIONS
) -> Posterior:  # fmt: skip
    """``verdicts``: tasks × models, 1 where the verifier accepted the attempt."""
    fa, fr = noise
    # The likelihood of each verdict if the attempt was right, and if it was wrong.
    given_right = np.where(verdicts[:, None, :] > 0.5, 1.0 - fr, fr)
    given_wrong = np.where(verdicts[:, None, :] > 0.5, fa, 1.0 - fa)
    prior = np.full(len(grid), 1.0 / len(grid))
    start = np.clip((verdicts.mean(axis=0) - fa) / max(1.0 - fa - fr, 1e-9), 0.02, 0.98)
    ability = np.log(start / (1.0 - start))
    weights, right = _expect(ability, prior, grid, given_right, given_wrong)
    for _ in range(iterations):
        prior = weights.mean(axis=0) + 1e-12
        prior /= prior.sum()
        # A Newton step per model on the expected log-likelihood of its outcomes.
        p = _sigmoid(ability[None, :] + grid[:, None])
        gradient = (weights[:, :, None] * (right - p[None])).sum(axis=(0, 1))
        curvature = (weights[:, :, None] * (p * (1.0 - p))[None]).sum(axis=(0, 1))
        ability = np.clip(ability + gradient / np.maximum(curvature, 1e-9), -12.0, 12.0)
        weights, right = _expect(ability, prior, grid, given_right, given_wrong)
    return Posterior(weights, right, ability)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def _expect(
    ability: np.ndarray, prior: np.ndarray, grid: np.ndarray, given_right: np.ndarray, given_wrong: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    p = _sigmoid(ability[None, :] + grid[:, None])[None]
    likely = p * given_right + (1.0 - p) * given_wrong
    log_w = np.log(prior)[None] + np.log(likely).sum(axis=2)
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True), p * given_right / likely


@dataclass(frozen=True)
class Rows:
    """Runs as the planner reads them: model → row → run, the rows in order, and their weights."""

    runs: dict[str, dict[str, Run]]
    ids: list[str]
    weights: np.ndarray
    #: The task each row stands for.
    task_of: dict[str, str]

    def of(self, tasks: Sequence[str]) -> Rows:
        """The rows of these tasks only."""
        keep = set(tasks)
        idx = [i for i, r in enumerate(self.ids) if self.task_of[r] in keep]
        ids = [self.ids[i] for i in idx]
        return Rows(self.runs, ids, self.weights[idx], {r: self.task_of[r] for r in ids})


def plain(runs: Mapping[str, Mapping[str, Run]], tasks: Sequence[str]) -> Rows:
    """One row per task, as the runs are."""
    return Rows(
        {m: dict(by) for m, by in runs.items()}, list(tasks), np.ones(len(tasks)), {t: t for t in tasks}
    )


def rows(judged: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], noise: tuple[float, float]) -> Rows:
    """``judged``: model → task → run whose ``resolved`` is the verifier's verdict. Each task
    becomes its likely difficulties, each row's runs carrying P(right | verdict, difficulty)."""
    models = sorted(judged)
    verdicts = np.array([[float(judged[m][t].resolved) for m in models] for t in tasks]).reshape(
        len(tasks), len(models)
    )
    post = fit(verdicts, noise)
    out: dict[str, dict[str, Run]] = {m: {} for m in models}
    ids: list[str] = []
    weights: list[float] = []
    task_of: dict[str, str] = {}
    for i, t in enumerate(tasks):
        keep = np.flatnonzero(post.weights[i] >= MIN_WEIGHT)
        w = post.weights[i, keep] / post.weights[i, keep].sum()
        for g, wg in zip(keep.tolist(), w.tolist(), strict=True):
            row = f"{t}|{g}"
            ids.append(row)
            weights.append(wg)
            task_of[row] = t
            for j, m in enumerate(models):
                out[m][row] = replace(judged[m][t], p_right=float(post.right[i, g, j]))
    return Rows(out, ids, np.array(weights), task_of)


#: (the controls, the target) → the margin and longest order to choose the target's order at.
InnerMargin = Callable[[Mapping[str, AttemptControl], float], margins.Margin]


def inner_margin(
    judged: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], noise: tuple[float, float], max_len: int,
    *, folds: int = margins.INNER_FOLDS, seed: int = 0,
) -> InnerMargin:  # fmt: skip
    """The inner cross-validation (``control.inner_margin``) under a noisy verifier: each inner
    fold's orders are chosen on rows read again on its own training tasks' verdicts alone, and its
    left-out tasks scored on their verdicts corrected by the verifier's rates (``judged``'s
    ``p_right``, unbiased for any order). Read once on every training task, the rows would let the
    left-out tasks' own verdicts shape the order scored on them, and the inner folds could not see
    a choice that rode on them."""
    read = per_fold(judged, tasks, noise)

    def margin(controls: Mapping[str, AttemptControl], target: float) -> margins.Margin:
        held_tbl = control.table(judged, tasks, controls, exact_noise=noise)
        return margins.learn(
            tasks, np.ones(len(tasks)), target, max_len, chooser(read, controls, noise, max_len),
            lambda held, seq: control.scored(control.subset(held_tbl, held), seq), folds=folds, seed=seed,
        )  # fmt: skip

    return margin


def per_fold(
    judged: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], noise: tuple[float, float]
) -> Callable[[np.ndarray], Rows]:
    """An inner fold's training tasks (indices into ``tasks``) → their rows, read on their own
    verdicts alone (each fold's read once: the targets share them)."""
    read_for: dict[bytes, Rows] = {}

    def read(fit: np.ndarray) -> Rows:
        key = fit.tobytes()
        if key not in read_for:
            read_for[key] = rows(judged, [tasks[i] for i in fit], noise)
        return read_for[key]

    return read


def chooser(
    read: Callable[[np.ndarray], Rows], controls: Mapping[str, AttemptControl], noise: tuple[float, float],
    max_len: int,
) -> margins.Choose:  # fmt: skip
    """An inner fold's choice of order at each (longest, target), on the rows ``read`` gives for
    its training tasks (indices into the tasks)."""

    def choose(fit: np.ndarray, choices: Sequence[tuple[int, float]]) -> list[list[int]]:
        r = read(fit)
        o = control.orders(control.table(r.runs, r.ids, controls, exact_noise=noise), max_len, r.weights)
        return [[j for j in o.seqs[o.best(t, k)].tolist() if j >= 0] for k, t in choices]

    return choose
