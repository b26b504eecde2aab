"""Reading noisy verdicts across models (``learning.training.verdicts``): exact verdicts come back
as they are, and under noise an order's share resolved read off the rows is nearer the truth
than read off each run's corrected verdict."""

from __future__ import annotations

import numpy as np
import pytest

from router.learning.training import control, verdicts
from router.learning.training import margin as margins


def _world(
    seed: int, tasks: int = 300, models: int = 8
) -> tuple[list[str], dict[str, dict[str, control.Run]]]:
    """Tasks of spread-out difficulty, models of spread-out ability: P(right) = σ(a + b)."""
    rng = np.random.default_rng(seed)
    b = rng.normal(0.0, 2.0, tasks)
    a = np.linspace(-1.5, 2.0, models)
    right = rng.random((tasks, models)) < 1.0 / (1.0 + np.exp(-(a[None, :] + b[:, None])))
    ids = [f"t{i}" for i in range(tasks)]
    runs = {f"m{j}": {t: control.Run(bool(right[i, j]), 0.1 * (j + 1), 10) for i, t in enumerate(ids)}
            for j in range(models)}  # fmt: skip
    return ids, runs


def _judged(runs: control.Runs, noise: tuple[float, float], seed: int) -> dict[str, dict[str, control.Run]]:
    fa, fr = noise
    rng = np.random.default_rng(seed + 1000)
    out: dict[str, dict[str, control.Run]] = {}
    for m, by in sorted(runs.items()):
        out[m] = {}
        for t, r in by.items():
            v = bool(rng.random() >= fr) if r.resolved else bool(rng.random() < fa)
            out[m][t] = control.Run(v, r.cost, r.calls, p_right=(float(v) - fa) / (1.0 - fa - fr))
    return out


def _orders(rows: verdicts.Rows, noise: tuple[float, float]) -> control.Orders:
    return control.orders(control.table(rows.runs, rows.ids, {}, exact_noise=noise), 3, rows.weights)


def test_exact_verdicts_come_back_as_the_outcomes() -> None:
    ids, runs = _world(0, tasks=60, models=4)
    rows = verdicts.rows(runs, ids, (0.0, 0.0))
    got, exact = _orders(rows, (0.0, 0.0)), _orders(verdicts.plain(runs, ids), (0.0, 0.0))
    assert got.resolved == pytest.approx(exact.resolved) and got.cost == pytest.approx(exact.cost)
    assert rows.of(ids[:10]).ids and {rows.task_of[r] for r in rows.of(ids[:10]).ids} == set(ids[:10])


def test_orders_read_across_models_are_nearer_the_truth_than_each_runs_verdict() -> None:
    # Worlds of 24 models, as the shipped data has, under the (d) target's verifier.
    noise = (0.3, 0.2)
    err_run, err_across, got_run, got_across = [], [], [], []
    for seed in range(4):
        ids, runs = _world(seed, models=24)
        judged = _judged(runs, noise, seed)
        truth = _orders(verdicts.plain(runs, ids), noise)
        per_run = _orders(verdicts.plain(judged, ids), noise)
        across = _orders(verdicts.rows(judged, ids, noise), noise)
        err_run.append(np.abs(per_run.resolved - truth.resolved).mean())
        err_across.append(np.abs(across.resolved - truth.resolved).mean())
        for target in (0.6, 0.7, 0.8):
            # What the order chosen for the target on each reading truly resolves.
            got_run.append(truth.resolved[per_run.best(target)])
            got_across.append(truth.resolved[across.best(target)])
    assert np.mean(err_across) < 0.85 * np.mean(err_run)
    # The order chosen on each run's verdict looked better than it is, by more.
    assert np.mean(got_across) > np.mean(got_run) + 0.03


def _flipped(
    judged: control.Runs, tasks: set[str], noise: tuple[float, float]
) -> dict[str, dict[str, control.Run]]:
    """Every model's verdict on ``tasks`` the other way round."""
    fa, fr = noise
    return {
        m: {t: control.Run(not r.resolved, r.cost, r.calls, p_right=(float(not r.resolved) - fa) / (1.0 - fa - fr))
            if t in tasks else r for t, r in by.items()}
        for m, by in judged.items()
    }  # fmt: skip


def test_an_inner_folds_orders_read_none_of_its_left_out_tasks_verdicts() -> None:
    """The inner cross-validation that picks the margin chooses each inner fold's orders on rows
    read on that fold's training tasks alone: turning the left-out tasks' verdicts round cannot
    change the orders they are scored on. Read once on every training task (as the margin was
    chosen before), the same change does."""
    noise = (0.3, 0.2)
    ids, runs = _world(1, tasks=120, models=6)
    judged = _judged(runs, noise, 1)
    held, *_ = margins.inner_folds(ids, margins.INNER_FOLDS, seed=0)
    fit = np.setdiff1d(np.arange(len(ids)), held)
    flipped = _flipped(judged, {ids[i] for i in held}, noise)
    choices = [(k, float(t)) for k in (1, 2, 3) for t in np.arange(0.40, 0.95, 0.01)]

    def per_fold(j: control.Runs) -> list[list[int]]:
        return [
            list(s) for s in verdicts.chooser(verdicts.per_fold(j, ids, noise), {}, noise, 3)(fit, choices)
        ]

    def read_once(j: control.Runs) -> list[list[int]]:
        every = verdicts.rows(j, ids, noise)
        read = lambda f: every.of([ids[i] for i in f])  # noqa: E731
        return [list(s) for s in verdicts.chooser(read, {}, noise, 3)(fit, choices)]

    assert per_fold(judged) == per_fold(flipped)
    assert read_once(judged) != read_once(flipped)
