"""The margin above a target an order is chosen at (router.learning.training.margin): measured by an
inner cross-validation on the training tasks, so that the chosen order reaches the target on tasks
it was not chosen on (a winner's curse otherwise: the cheapest order reaching it is a lucky one)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from router.learning.training import control, margin


def test_the_choice_reaching_the_target_held_out_at_the_least_cost() -> None:
    # The order chosen at target + m among orders of up to k models resolves target − 2 pt + m of
    # the rows left out, at a cost per row of m + k / 100.
    target = 0.8
    seen: list[np.ndarray] = []

    def choose(fit: np.ndarray, choices: Sequence[tuple[int, float]]) -> list[list[int]]:
        seen.append(fit)
        return [[k, round(1000 * (t - target))] for k, t in choices]

    def score(held: np.ndarray, seq: Sequence[int]) -> tuple[float, float]:
        return target - 0.02 + seq[1] / 1000, seq[1] / 1000 + seq[0] / 100

    groups = [f"t{i // 3}" for i in range(120)]  # three rows a task
    got = margin.learn(groups, np.ones(120), target, 4, choose, score)
    assert (got.longest, got.margin) == (1, 0.02)
    assert got.held_out[1, 0.0][0] == pytest.approx(0.78) and got.held_out[4, 0.04][0] == pytest.approx(0.82)
    assert got.held_out[2, 0.02][1] == pytest.approx((0.02 + 0.02) / 0.8)
    # Each inner fit leaves out whole tasks: a task's rows are never split between fit and held out.
    assert len(seen) == margin.INNER_FOLDS
    for fit in seen:
        left_out = set(range(120)) - set(fit.tolist())
        assert {groups[i] for i in left_out}.isdisjoint({groups[i] for i in fit.tolist()})


def test_no_choice_reaching_the_target_keeps_the_one_resolving_most() -> None:
    def choose(fit: np.ndarray, choices: Sequence[tuple[int, float]]) -> list[list[int]]:
        return [[k, margin.MARGINS.index(round(t - 0.8, 6))] for k, t in choices]

    held = [0.70, 0.72, 0.74, 0.73, 0.71, 0.70, 0.69]
    got = margin.learn(
        [f"t{i}" for i in range(40)],
        np.ones(40),
        0.8,
        2,
        choose,
        lambda _, seq: (held[seq[1]] - seq[0] / 1000, 1.0),
    )
    assert (got.longest, got.margin) == (1, margin.MARGINS[2])


def _table(seed: int, n: int = 60, m: int = 5) -> tuple[control.Table, np.ndarray]:
    rng = np.random.default_rng(seed)
    right = rng.random((n, m))
    accept = rng.uniform(0.6, 1.0, (n, m))
    false_accept = rng.uniform(0.0, 0.4, (n, m))
    tbl = control.Table(tuple(f"m{j}" for j in range(m)), right, rng.random((n, m)), accept, false_accept)
    return tbl, rng.uniform(0.1, 1.0, n)


def test_one_orders_share_resolved_is_the_grids() -> None:
    for seed in range(5):
        tbl, w = _table(seed)
        grid = control.orders(tbl, 3, w)
        for i in random.Random(seed).sample(range(len(grid.resolved)), 30):
            seq = [j for j in grid.seqs[i].tolist() if j >= 0]
            got, cost = control.scored(tbl, seq, w)
            assert got == pytest.approx(grid.resolved[i], rel=1e-12)
            assert cost == pytest.approx(grid.cost[i], rel=1e-12)
        # A subset of the rows is the table of those rows.
        index = np.arange(0, 60, 2)
        part, whole = (
            control.subset(tbl, index),
            control.Table(tbl.models, tbl.right[::2], tbl.cost[::2], tbl.accept[::2], tbl.false_accept[::2]),
        )
        assert control.scored(part, [1, 0], w[index]) == control.scored(whole, [1, 0], w[::2])


def _cursed(n: int, seed: int) -> dict[str, dict[str, control.Run]]:
    """Eight models of the same true chance, 0.5, and of different prices: on a sample, which one
    completes a cascade best is luck."""
    rng = random.Random(seed)
    return {
        f"m{j}": {f"t{i}": control.Run(rng.random() < 0.5, 0.1 * (j + 1), 10) for i in range(n)}
        for j in range(8)
    }


def test_learn_chooses_the_order_above_its_target_by_the_inner_margin() -> None:
    runs = _cursed(200, 1)
    tasks = sorted(runs["m0"])
    at_target = control.learn(runs, tasks, 3, 0.88, caps=False, stop_loss=False, inner_folds=0)
    assert at_target.margin == 0.0 and at_target.longest is None and at_target.held_out == {}
    got = control.learn(runs, tasks, 3, 0.88, caps=False, stop_loss=False)
    # The order chosen at the target resolves less on the inner folds left out than the target.
    assert got.held_out[3, 0.0][0] < 0.88
    assert got.margin > 0 and got.margin in margin.MARGINS
    assert got.resolved >= 0.88 + got.margin - 1e-12
    tbl = control.table(runs, tasks, {})
    grid = control.orders(tbl, 3)
    assert got.plan == grid.names(grid.best(0.88 + got.margin, got.longest))
    assert len(got.plan) <= (got.longest or 3)


def test_best_among_the_orders_of_at_most_so_many_models() -> None:
    tbl, w = _table(11)
    grid = control.orders(tbl, 3, w)
    length = (grid.seqs >= 0).sum(axis=1)
    short = np.flatnonzero(length <= 2)
    for target in (None, 0.3, 0.6, 0.99):
        i = grid.best(target, longest=2)
        assert length[i] <= 2
        alone = control.Orders(grid.models, grid.seqs[short], grid.resolved[short], grid.cost[short])
        assert grid.names(i) == alone.names(alone.best(target))
