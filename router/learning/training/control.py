"""Control inside the attempt, learned on the training tasks: per model a call cap and a stop-loss
threshold, and the fixed order of models chosen under them by the same objective.

What an attempt does under a control is read off its recorded run (``controlled``): stopped at the
call where the cap or the stop-loss (``router.features.task.attempt``) would have refused the next one,
paying the calls before it — at their recorded costs where the conversation is known, else as
their share of the run's cost (only a cap can stop a run whose conversation is unknown). Every
fixed order of up to N distinct models is then scored on the training tasks at once (``orders``):
each step completes the task when its result is right and accepted, goes on when it is rejected or
stopped, and the last step's result stands either way (nothing comes after it to replace it).

The cap is ``CAP_FACTOR`` × the median calls of a model's resolved runs. A stop-loss threshold is
chosen per model among ``THRESHOLDS`` by the objective (least cost per completed task among orders
reaching the target), on readings of the label model fitted without the task (out of fold), and
kept only where it beats both no stop-loss and a random stop of the same share at the same calls:
otherwise it would be selling a cut in spending that any stop buys.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from router.features.task.attempt import NONE, AttemptControl, first_stop
from router.learning.training import margin as margins

CAP_FACTOR = 2.0
#: Caps tried per model: multiples of the median calls of its resolved runs.
CAP_FACTORS = (1.5, 2.0, 3.0)
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
RANDOM_STOP = "random_stop"
#: A control is kept only where it cuts the cost per completed task by at least this share.
MIN_GAIN = 0.02
#: Seeds a random stop is drawn with (its cost per completed task is their mean).
RANDOM_DRAWS = 3
#: How many models the trials search orders of (the final order is searched among all).
SHORTLIST = 12


@dataclass(frozen=True, slots=True)
class Run:
    """One recorded attempt: its outcome and, where the conversation is known, each call's cost
    and the label model's P(success) before each call."""

    resolved: bool
    cost: float
    calls: int
    call_costs: Sequence[float] | None = None
    readings: Sequence[float] | None = None
    #: What the planner takes as the chance the result was right, when ``resolved`` is a verdict
    #: (a noisy verifier's, corrected by its known error rates); None: ``resolved`` is the truth.
    p_right: float | None = None


#: model → task (or a row standing for one) → run.
Runs = Mapping[str, Mapping[str, Run]]


@dataclass(frozen=True, slots=True)
class Controlled:
    right: float
    cost: float
    calls: int
    stopped: str | None


def controlled(run: Run, control: AttemptControl = NONE, random_at: int | None = None) -> Controlled:
    """The run as it would have gone under ``control`` (and a random stop before call ``random_at``)."""
    stop: tuple[int, str] | None = None
    if run.call_costs is not None:
        stop = first_stop(control, len(run.call_costs), run.readings)
        if (
            random_at is not None
            and random_at < len(run.call_costs)
            and (stop is None or random_at < stop[0])
        ):
            stop = (random_at, RANDOM_STOP)
    else:
        stop = first_stop(dataclasses.replace(control, stop_below=None), run.calls)
    if stop is None:
        return Controlled(
            float(run.resolved if run.p_right is None else run.p_right), run.cost, run.calls, None
        )
    return Controlled(0.0, spent(run, stop[0]), stop[0], stop[1])


def spent(run: Run, calls: int) -> float:
    """USD of the run's first ``calls`` calls."""
    if run.call_costs is not None:
        return float(sum(run.call_costs[:calls]))
    return run.cost * calls / run.calls if run.calls else 0.0


def cap_for(resolved_calls: Sequence[int], factor: float = CAP_FACTOR) -> int | None:
    """The learned cap: ``factor`` × the median calls of resolved runs (None without any)."""
    if not resolved_calls:
        return None
    return max(1, math.ceil(factor * float(np.median(resolved_calls))))


@dataclass(frozen=True, slots=True)
class RandomStop:
    """A seeded draw stops ``probability`` of a model's attempts, each before a call drawn from
    ``at_calls`` (the stop-loss's own stopping calls): the control a stop-loss must beat."""

    probability: float
    at_calls: tuple[int, ...]
    seed: int = 0

    def stop_at(self, task_id: str, model: str) -> int | None:
        rng = random.Random(f"random-stop:{self.seed}:{task_id}:{model}")
        if not self.at_calls or rng.random() >= self.probability:
            return None
        return rng.choice(self.at_calls)


def matched_random_stop(runs: Mapping[str, Run], control: AttemptControl, seed: int = 0) -> RandomStop | None:
    """A random stop as frequent as ``control``'s stop-loss on ``runs`` (task → run), at its calls."""
    at: list[int] = []
    reach: list[int] = []
    for r in runs.values():
        if r.call_costs is None:
            continue
        reach.append(len(r.call_costs))
        got = controlled(r, control)
        if got.stopped is not None and got.stopped != "max_calls_per_attempt":
            at.append(got.calls)
    if not at or not reach:
        return None
    # A drawn call past the end of a run stops nothing: draw more often to stop as many runs.
    reached = float(np.mean([sum(c > k for c in reach) / len(reach) for k in at]))
    share = len(at) / len(reach)
    return RandomStop(min(1.0, share / max(reached, 1e-9)), tuple(sorted(at)), seed)


@dataclass(frozen=True)
class Table:
    """Per training task × model: the attempt's result under the controls, as the planner sees it."""

    models: tuple[str, ...]
    right: np.ndarray
    cost: np.ndarray
    #: P(the verifier accepts | right) and P(accepts | wrong); a stopped attempt is never judged.
    accept: np.ndarray
    false_accept: np.ndarray


#: (task, model, right) → (P accept | right, P accept | wrong): how the verifier judges a result.
Judging = Mapping[tuple[str, str], tuple[float, float]]


def column(
    runs: Mapping[str, Run], tasks: Sequence[str], model: str, control: AttemptControl = NONE,
    judging: Judging | None = None, random_stop: RandomStop | None = None,
    exact_noise: tuple[float, float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One model's (right, cost, P accept | right, P accept | wrong) per task under ``control``."""
    n = len(tasks)
    right, cost = np.zeros(n), np.zeros(n)
    accept, false_accept = np.full(n, 1.0 - exact_noise[1]), np.full(n, exact_noise[0])
    for i, t in enumerate(tasks):
        got = controlled(runs[t], control, random_stop.stop_at(t, model) if random_stop is not None else None)
        right[i], cost[i] = got.right, got.cost
        if got.stopped is not None:
            accept[i] = false_accept[i] = 0.0
        elif judging is not None and (t, model) in judging:
            accept[i], false_accept[i] = judging[t, model]
    return right, cost, accept, false_accept


def table(
    runs: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], controls: Mapping[str, AttemptControl],
    judging: Judging | None = None, random_stops: Mapping[str, RandomStop] | None = None,
    exact_noise: tuple[float, float] = (0.0, 0.0),
) -> Table:  # fmt: skip
    """``runs``: model → task → run. ``judging`` overrides ``exact_noise`` (FA, FR) per (task, model)."""
    models = tuple(sorted(runs))
    cols = [
        column(runs[m], tasks, m, controls.get(m, NONE), judging, (random_stops or {}).get(m), exact_noise)
        for m in models
    ]
    return _stack(models, cols)


def _stack(models: tuple[str, ...], cols: Sequence[tuple[np.ndarray, ...]]) -> Table:
    right, cost, accept, false_accept = (np.stack([c[k] for c in cols], axis=1) for k in range(4))
    return Table(models, right, cost, accept, false_accept)


@dataclass(frozen=True)
class Orders:
    """Every fixed order of up to N distinct models: (index of each model, -1 past its end),
    expected share resolved and cost per task on the tasks it was scored on."""

    models: tuple[str, ...]
    seqs: np.ndarray
    resolved: np.ndarray
    cost: np.ndarray

    def names(self, i: int) -> tuple[str, ...]:
        return tuple(self.models[j] for j in self.seqs[i] if j >= 0)

    def best(self, target: float | None = None, longest: int | None = None) -> int:
        """The least cost per completed task (ties: the shorter); with a target, among orders
        reaching it (else the one resolving most); with ``longest``, among orders of at most that
        many models."""
        cpc = np.where(self.resolved > 0, self.cost / np.maximum(self.resolved, 1e-12), np.inf)
        length = (self.seqs >= 0).sum(axis=1)
        fits = np.ones(len(cpc), dtype=bool) if longest is None else length <= longest
        ok = fits & (True if target is None else self.resolved >= target - 1e-12)
        if not ok.any():
            return int(np.lexsort((self.cost, np.where(fits, -self.resolved, np.inf)))[0])
        key = np.where(ok, cpc, np.inf)
        return int(np.lexsort((length, key))[0])


def orders(
    tbl: Table, max_len: int, weights: np.ndarray | None = None, *, only: Sequence[int] | None = None
) -> Orders:
    """``weights``: how much each row of the table counts (default: one each); ``only``: the one
    order to score (and its beginnings), not every order."""
    n, m = tbl.right.shape
    width = max(max_len, 1)
    done = tbl.right * tbl.accept
    going = tbl.right * (1.0 - tbl.accept) + (1.0 - tbl.right) * (1.0 - tbl.false_accept)
    seqs: list[np.ndarray] = []
    resolved: list[np.ndarray] = []
    cost: list[np.ndarray] = []
    every = np.arange(m)

    def extend(prefix: tuple[int, ...], alive: np.ndarray, res: float, spent_: float) -> None:
        # Every next model at once: the order ending with it, then (if longer ones fit) each one extended.
        nxt = np.array([only[len(prefix)]]) if only else np.setdiff1d(every, prefix, assume_unique=True)
        step_cost = (alive @ tbl.cost / n)[nxt]
        block = np.full((len(nxt), width), -1, dtype=np.int16)
        block[:, : len(prefix)] = prefix
        block[:, len(prefix)] = nxt
        seqs.append(block)
        resolved.append(res + (alive @ tbl.right / n)[nxt])
        cost.append(spent_ + step_cost)
        if len(prefix) + 1 < max_len:
            on = (alive @ done / n)[nxt]
            for j, d, c in zip(nxt.tolist(), on.tolist(), step_cost.tolist(), strict=True):
                extend((*prefix, j), alive * going[:, j], res + d, spent_ + c)

    if m and max_len > 0:
        extend((), np.ones(n) if weights is None else weights * n / weights.sum(), 0.0, 0.0)
    if not seqs:
        return Orders(tbl.models, np.zeros((0, width), dtype=np.int16), np.zeros(0), np.zeros(0))
    return Orders(tbl.models, np.concatenate(seqs), np.concatenate(resolved), np.concatenate(cost))


def scored(tbl: Table, seq: Sequence[int], weights: np.ndarray | None = None) -> tuple[float, float]:
    """(share resolved, cost per row) of one order on ``tbl``'s rows (weighted): ``orders``' own
    arithmetic, on that order alone (its last line is the whole order)."""
    if len(tbl.right) == 0 or not seq:
        return 0.0, 0.0
    one = orders(tbl, len(seq), weights, only=seq)
    return float(one.resolved[-1]), float(one.cost[-1])


def subset(tbl: Table, index: np.ndarray) -> Table:
    """The table's rows at ``index``."""
    return Table(tbl.models, tbl.right[index], tbl.cost[index], tbl.accept[index], tbl.false_accept[index])


def shortlist(
    runs: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], size: int = SHORTLIST
) -> tuple[str, ...]:
    """The models the trials search orders of: the cheapest per completed task and the strongest
    (24 models make 255k orders of four; a dozen, 12k)."""
    rate = {m: sum(runs[m][t].resolved for t in tasks) / max(len(tasks), 1) for m in runs}
    spend = {m: sum(runs[m][t].cost for t in tasks) / max(len(tasks), 1) for m in runs}
    cheap = sorted(runs, key=lambda m: spend[m] / rate[m] if rate[m] else math.inf)
    strong = sorted(runs, key=lambda m: (-rate[m], spend[m]))
    picked = list(dict.fromkeys([*cheap[: size - size // 3], *strong[: size // 3]]))
    for m in cheap:
        if len(picked) >= size:
            break
        if m not in picked:
            picked.append(m)
    return tuple(sorted(picked[:size] if len(picked) > size else picked))


def inner_margin(
    tbl: Table, groups: Sequence[str], weights: np.ndarray | None, target: float, max_len: int, *,
    folds: int = margins.INNER_FOLDS, seed: int = 0, memo: dict[tuple[int, bytes], Orders] | None = None,
) -> margins.Margin:  # fmt: skip
    """The margin above ``target`` and the longest order (``router.learning.training.margin``) for
    orders of up to ``max_len`` of ``tbl``'s models, each row of it a task of ``groups``: what the
    evaluation (``learn``) and ``router train`` (``router.learning.training.prior.margins``) both
    choose their order for a target at. ``memo`` keeps each inner fold's orders across calls on
    the same table (the folds depend only on ``groups`` and ``seed``, not on the target)."""
    w = np.ones(len(groups)) if weights is None else np.asarray(weights, dtype=float)
    memo = {} if memo is None else memo

    def choose(fit: np.ndarray, choices: Sequence[tuple[int, float]]) -> list[list[int]]:
        key = (max_len, fit.tobytes())
        if key not in memo:
            memo[key] = orders(subset(tbl, fit), max_len, w[fit])
        inner = memo[key]
        return [[j for j in inner.seqs[inner.best(t, k)].tolist() if j >= 0] for k, t in choices]

    return margins.learn(
        groups, w, target, max_len, choose, lambda held, seq: scored(subset(tbl, held), seq, w[held]),
        folds=folds, seed=seed,
    )  # fmt: skip


@dataclass(frozen=True)
class Learned:
    controls: dict[str, AttemptControl]
    plan: tuple[str, ...]
    resolved: float
    cost: float
    #: What was tried: per model, the caps and stop-loss thresholds and what each reached.
    report: dict[str, dict[str, object]]
    #: How far above the target, and among orders of how many models at most, the order was
    #: chosen (``router.learning.training.margin``), and what each choice tried did on the inner
    #: folds left out: (longest, margin) → (share resolved, cost per completed task).
    margin: float = 0.0
    longest: int | None = None
    held_out: dict[tuple[int, float], tuple[float, float]] = field(default_factory=dict)


def cpc(o: Orders, i: int) -> float:
    return float(o.cost[i] / o.resolved[i]) if o.resolved[i] > 0 else math.inf


def learn(
    runs: Mapping[str, Mapping[str, Run]], tasks: Sequence[str], max_len: int, target: float | None,
    judging: Judging | None = None, exact_noise: tuple[float, float] = (0.0, 0.0), *,
    caps: bool = True, stop_loss: bool = True, cap_factors: Sequence[float] = CAP_FACTORS,
    thresholds: Sequence[float] = THRESHOLDS, seed: int = 0, weights: np.ndarray | None = None,
    task_of: Mapping[str, str] | None = None, inner_folds: int = margins.INNER_FOLDS,
    inner: Callable[[Mapping[str, AttemptControl], float], margins.Margin] | None = None,
) -> Learned:  # fmt: skip
    """Caps, stop-loss thresholds and the order chosen under them, on ``tasks`` (training only;
    ``weights``: how much each counts, for rows standing for a task's likely difficulties, and
    ``task_of`` the task each row stands for). With a target, the order is chosen at the target
    plus the margin an inner cross-validation on ``tasks`` finds it needs to reach the target on
    tasks it was not chosen on (``inner_folds`` = 0: at the target itself); ``inner``: that
    cross-validation (given the controls and the target) where it must read the tasks otherwise
    than as ``runs`` (``router.learning.training.verdicts.inner_margin``).

    Greedy, on the models of the order chosen so far (a control on a model no order uses changes
    nothing): each keeps a cap or a threshold only where the order chosen under it costs less per
    completed task than without it; a threshold must also beat a random stop of its share."""
    everyone = tuple(sorted(runs))
    controls = {m: NONE for m in everyone}
    models = shortlist(runs, tasks)
    cache: dict[tuple[str, AttemptControl, RandomStop | None], tuple[np.ndarray, ...]] = {}

    def col(m: str, c: AttemptControl, rnd: RandomStop | None = None) -> tuple[np.ndarray, ...]:
        key = (m, c, rnd)
        if key not in cache:
            cache[key] = column(runs[m], tasks, m, c, judging, rnd, exact_noise)
        return cache[key]

    def score(
        ctrls: Mapping[str, AttemptControl], rnd: Mapping[str, RandomStop] | None = None,
        among: tuple[str, ...] = models,
    ) -> tuple[float, Orders, int]:  # fmt: skip
        tbl = _stack(among, [col(m, ctrls[m], (rnd or {}).get(m)) for m in among])
        o = orders(tbl, max_len, weights)
        i = o.best(target)
        return cpc(o, i), o, i

    best, o, i = score(controls)
    report: dict[str, dict[str, object]] = {}
    resolved_calls = {m: [r.calls for t, r in runs[m].items() if r.resolved] for m in models}
    for m in o.names(i) if caps else ():
        tried: dict[str, float] = {}
        for f in cap_factors:
            cap = cap_for(resolved_calls[m], f)
            if cap is None:
                continue
            trial = {**controls, m: dataclasses.replace(controls[m], max_calls=cap)}
            got = score(trial)
            tried[str(cap)] = got[0]
            if got[0] < best * (1 - MIN_GAIN):
                best, o, i, controls = got[0], got[1], got[2], trial
        report.setdefault(m, {})["caps"] = tried
    with_readings = [m for m in models if any(r.readings is not None for r in runs[m].values())]
    for m in with_readings if stop_loss else ():
        trials = []
        for t in thresholds:
            trial = {**controls, m: dataclasses.replace(controls[m], stop_below=t)}
            trials.append((score(trial), t, trial))
        (got, t, trial) = min(trials, key=lambda x: x[0][0])
        # The control's draws are noise too: its cost per completed task averaged over several.
        draws = [matched_random_stop(runs[m], trial[m], seed + d) for d in range(RANDOM_DRAWS)]
        random_cpc = (
            float(np.mean([score(controls, {m: r})[0] for r in draws if r is not None]))
            if any(r is not None for r in draws)
            else math.inf
        )
        kept = got[0] < best * (1 - MIN_GAIN) and got[0] < random_cpc * (1 - MIN_GAIN)
        report.setdefault(m, {}).update({"threshold": t, "cost_per_completed": got[0], "without": best,
                                         "random_stop": random_cpc, "kept": kept})  # fmt: skip
        if kept:
            best, o, i, controls = got[0], got[1], got[2], trial
    # The trials searched the shortlist; the order itself is chosen among every model.
    _, o, i = score(controls, among=everyone)
    chosen = margins.Margin(0.0, None, {})
    if target is not None and inner is not None:
        chosen = inner(controls, target)
        i = o.best(chosen.at(target), chosen.longest)
    elif target is not None and inner_folds:
        tbl = _stack(everyone, [col(m, controls[m]) for m in everyone])
        groups = [task_of.get(t, t) if task_of is not None else t for t in tasks]
        chosen = inner_margin(tbl, groups, weights, target, max_len, folds=inner_folds, seed=seed)
        i = o.best(chosen.at(target), chosen.longest)
    return Learned({m: c for m, c in controls.items() if c.active}, o.names(i), float(o.resolved[i]),
                   float(o.cost[i]), report, chosen.margin, chosen.longest, chosen.held_out)  # fmt: skip
