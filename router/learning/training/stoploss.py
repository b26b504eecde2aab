"""The stop-loss ``router train`` learns: per model, the threshold on the label model's P(success |
the conversation so far) below which the proxy ends an attempt, or none.

It is learned from attempts whose outcome is known and whose every call is recorded with the
reading the stop-loss read before it. Two sources give them:

- the log (``runs_from_log``, what ``router train`` reads without ``--trajectories``): every
  main-loop call logs the P(success) the stop rule read at it (``p_success``: the attempt's latest
  label, from the label model in force), and the attempt's explicit outcome says how it ended. An
  inferred outcome is left out: it is the label model's own last reading, which its earlier ones
  would predict by construction;
- recorded agent runs (``runs_from``, ``router train --trajectories``: the format ``router eval``
  and ``router eval-labels`` read), each read call by call by a label model fitted without its
  task (out of fold, on the other runs given): the shipped label model has seen the shipped runs,
  and would read them too well.

A threshold is judged by the model's cost per completed task under it: a stopped attempt pays the
calls made and completes nothing. The next model of the plan is tried after a failure whether it
was stopped or ran to its end, so this is what a stop saves and costs on this model (the rescue a
stopped success may still get from the next model is not counted: the rule leans towards off).
Chosen out of fold: on each fold's other tasks the best of ``THRESHOLDS`` (none if none beats no
stop-loss there), measured on the fold's own tasks beside a random stop as frequent, at the same
calls, as the threshold was on the other tasks. A model's stop-loss is on (at the threshold best
on all its runs) only where, pooled over the held-out folds, it beats both no stop-loss and the
random stop by ``MIN_GAIN``: otherwise it sells a cut in spending that any stop buys.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from router.features.task.attempt import NONE, AttemptControl
from router.learning.evals import turns
from router.learning.training.control import (
    MIN_GAIN,
    RANDOM_DRAWS,
    THRESHOLDS,
    RandomStop,
    Run,
    controlled,
    matched_random_stop,
)
from router.learning.training.dataset import EXPLICIT, AttemptRow
from router.store import RequestRecord

#: Runs a model needs for a stop-loss.
MIN_RUNS = 40
FOLDS = 5


def runs_from(known: Mapping[tuple[str, str], turns.Turns], seed: int = 0) -> dict[str, dict[str, Run]]:
    """model → task → the run as the stop-loss reads it: each call's cost, and P(success) before
    each call from a label model fitted without the run's task."""
    if len({r.resolved for r in known.values()}) < 2:
        return {}  # a label model needs both outcomes to be fitted
    read = turns.out_of_fold(known, seed=seed)
    out: dict[str, dict[str, Run]] = {}
    for (t, m), r in sorted(known.items()):
        out.setdefault(m, {})[t] = Run(r.resolved, float(sum(r.costs)), r.calls, r.costs,
                                       tuple(float(p) for p in read.before[t, m]))  # fmt: skip
    return out


def runs_from_log(
    requests: Iterable[RequestRecord], attempts: Iterable[AttemptRow]
) -> dict[str, dict[str, Run]]:
    """model → task → the run of the task's first attempt on the model (a repeat after a failure is
    another question), for each attempt with an explicit outcome (``attempts``: ``dataset.build``'s
    rows): its main-loop calls a backend answered, in order, with their costs and the P(success)
    logged before each (NaN where none was read: the stop-loss cannot act there). An attempt the
    router stopped counts as it went: a failure that paid the calls it made."""
    calls: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if r.task_id and not r.side_call and r.status == 200 and r.chosen_model:
            calls[r.task_id, r.attempt or 1].append(r)
    out: dict[str, dict[str, Run]] = {}
    for a in attempts:
        made = sorted(calls.get((a.task_id, a.attempt), ()), key=lambda r: r.ts)
        if a.label_source != EXPLICIT or a.model in a.failed_before or not made:
            continue
        costs = tuple(float(r.cost_usd or 0.0) for r in made)
        readings = tuple(math.nan if r.p_success is None else float(r.p_success) for r in made)
        out.setdefault(a.model, {}).setdefault(
            a.task_id, Run(a.success, sum(costs), len(made), costs, readings)
        )
    # A model none of whose calls logged a reading (a log from before the column) says nothing.
    return {m: runs for m, runs in out.items() if any(_read(r) for r in runs.values())}


def _read(run: Run) -> bool:
    return any(not math.isnan(p) for p in run.readings or ())


@dataclass(frozen=True)
class Choice:
    """One model's stop-loss: the threshold kept (None: off) and what decided it."""

    model: str
    runs: int
    threshold: float | None
    #: The threshold best on all the model's attempts (kept or not); None: none beat no stop-loss.
    best: float | None = None
    #: Pooled over the held-out folds: cost per completed task with the threshold chosen on the
    #: other folds, with no stop-loss, and with the random stop of the same share.
    held_out: tuple[float, float, float] | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        def r(x: float) -> float | None:
            return round(x, 6) if math.isfinite(x) else None

        held = None if self.held_out is None else dict(zip(("with", "without", "random_stop"),
                                                             map(r, self.held_out), strict=True))  # fmt: skip
        return {"runs": self.runs, "threshold": self.threshold, "best": self.best,
                "held_out_cost_per_completed": held, "reason": self.reason}  # fmt: skip


def _tally(
    runs: Mapping[str, Run], control: AttemptControl, rnd: RandomStop | None = None
) -> tuple[float, float]:
    """(cost, completed) of these runs under ``control`` (and a random stop)."""
    cost = done = 0.0
    for key, run in runs.items():
        got = controlled(run, control, None if rnd is None else rnd.stop_at(key, ""))
        cost += got.cost
        done += got.right
    return cost, done


def _cpc(cost: float, done: float) -> float:
    return cost / done if done > 0 else math.inf


def _best(runs: Mapping[str, Run], thresholds: Sequence[float]) -> float | None:
    """The threshold with the least cost per completed task on ``runs``, if it beats none."""
    none = _cpc(*_tally(runs, NONE))
    scored = [(_cpc(*_tally(runs, AttemptControl(stop_below=t))), t) for t in thresholds]
    cpc, t = min(scored)
    return t if cpc < none else None


def choose(
    model: str, runs: Mapping[str, Run], *, folds: int = FOLDS, seed: int = 0,
    thresholds: Sequence[float] = THRESHOLDS, min_runs: int = MIN_RUNS,
) -> Choice:  # fmt: skip
    """``runs``: task → one run of ``model``."""
    n = len(runs)
    if n < min_runs:
        return Choice(model, n, None, reason=f"too few runs ({n} < {min_runs})")
    if len({r.resolved for r in runs.values()}) < 2:
        return Choice(model, n, None, reason="every run ended the same way")
    tasks = sorted(runs)
    order = np.random.default_rng(seed).permutation(len(tasks))
    fold_of = {tasks[i]: j % folds for j, i in enumerate(order)}
    totals = np.zeros((3, 2))  # with, without, random: (cost, completed)
    for f in range(folds):
        held = {k: r for k, r in runs.items() if fold_of[k] == f}
        rest = {k: r for k, r in runs.items() if fold_of[k] != f}
        if not held or not rest:
            continue
        t = _best(rest, thresholds)
        with_, without = _tally(held, NONE if t is None else AttemptControl(stop_below=t)), _tally(held, NONE)
        draws = [] if t is None else [matched_random_stop(rest, AttemptControl(stop_below=t), seed + d)
                                      for d in range(RANDOM_DRAWS)]  # fmt: skip
        draws_ = [d for d in draws if d is not None]
        rnd = np.mean([_tally(held, NONE, d) for d in draws_], axis=0) if draws_ else np.array(without)
        totals += np.array([with_, without, rnd])
    held_out = (float(_cpc(*totals[0])), float(_cpc(*totals[1])), float(_cpc(*totals[2])))
    best = _best(runs, thresholds)
    beats = held_out[0] < held_out[1] * (1 - MIN_GAIN) and held_out[0] < held_out[2] * (1 - MIN_GAIN)
    if best is None:
        reason = "no threshold lowered the cost per completed task"
    elif beats:
        reason = "beat no stop-loss and a random stop of the same share out of fold"
    else:
        reason = "did not beat both no stop-loss and a random stop of the same share out of fold"
    return Choice(model, n, best if beats and best is not None else None, best, held_out, reason)


def learn(runs: Mapping[str, Mapping[str, Run]], *, seed: int = 0, min_runs: int = MIN_RUNS) -> dict[str, Choice]:  # fmt: skip
    return {m: choose(m, by, seed=seed, min_runs=min_runs) for m, by in sorted(runs.items())}


def merge(caps: Mapping[str, AttemptControl], choices: Mapping[str, Choice]) -> dict[str, AttemptControl]:
    """The artifact's attempt controls: the caps, with the kept stop-losses added."""
    out = dict(caps)
    for m, c in choices.items():
        if c.threshold is not None:
            out[m] = replace(out.get(m, NONE), stop_below=c.threshold)
    return out


def line(choices: Mapping[str, Choice], source: str = "the log") -> str:
    """``source``: where the runs came from (the log, or --trajectories PATH)."""
    if not choices:
        return (f"stop-loss: off (no attempt in {source} of a model of this log with an explicit outcome "
                "and the P(success) read at each call)")  # fmt: skip
    parts = []
    for m, c in choices.items():
        if c.threshold is not None and c.held_out is not None:
            w, n, r = c.held_out
            parts.append(f"{m} below {c.threshold:g} (held out: ${w:.4f} per completed task against "
                         f"${n:.4f} without, ${r:.4f} with a random stop)")  # fmt: skip
        else:
            parts.append(f"{m} off ({c.reason})")
    return f"stop-loss per model from {source} (label model's P(success) read from call 3 on): " + "; ".join(
        parts
    )
