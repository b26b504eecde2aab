"""The objective: the plan worth most, ``V · success − cost``. Pure arithmetic.

For a candidate m, ``p_m`` is the probability an attempt on m succeeds and ``c_m`` the expected
cost of that attempt. A plan is the sequence of models tried, one attempt each, until one
succeeds or the retry limit is reached:

    cost(plan)    = Σ_k c_k · Π_{j<k} (1 - p_j)
    success(plan) = 1 - Π_k (1 - p_k)

and what it is worth is ``V · success − cost``, with ``V`` what a completed task is worth to the
operator (``value_per_completed_usd``, or the value at which the fleet meets a success target,
calibrated on training data). Stopping is a plan too: it is worth 0, so another attempt is made
only when its expected gain beats its cost (``Plan.gain``). Without a value, each task is valued
at its own least cost per completed task (the cheapest plan per success, which never stops).
Plans are enumerated exactly (a handful of candidates, a retry limit of two or three), within a
per-task budget.

Failures of one task are not independent: a task one model failed is likely harder for the next.
With a task effect (``task_sd`` > 0, learned with the artifact), each task has an unseen
difficulty ``u ~ N(0, 1)`` that shifts every model's logit by ``task_sd · u``; the products
above are then averaged over ``u`` (Gauss–Hermite), weighted by how likely the failures already
seen make each ``u``. With ``task_sd`` = 0 this is the independent formula exactly.

Results are judged by the deployment's verifier, which may accept a wrong result (``FA``) and
reject a right one (``FR``): its known rates are ``noise``. An attempt then completes the task
with ``p (1 − FR)``, ends it unresolved with ``(1 − p) FA`` (a wrong result accepted: nothing
comes after it), and goes on with ``p FR + (1 − p)(1 − FA)``; the last attempt's right result
stands whatever the verdict (nothing replaces it), as ``router eval`` and ``router train``'s
frontier count it. A rejection seen is then weaker evidence of a hard task than a failure. With
``noise`` = (0, 0) every formula above is the exact verifier's.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Success of a model that already failed this task, relative to a fresh try: agent runs are
#: noisy, so a repeat is not hopeless, but it is much less likely than the first time.
REPEAT_FACTOR = 0.35
#: Quadrature points over the task effect.
NODES = 9
#: (accepts a wrong result, rejects a right one): a verifier that is always right.
EXACT = (0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Option:
    model: str
    p_success: float
    attempt_cost: float


@dataclass(frozen=True, slots=True)
class Plan:
    models: tuple[str, ...]
    expected_cost: float
    success: float

    @property
    def cost_per_completed(self) -> float:
        return self.expected_cost / self.success if self.success > 0 else float("inf")

    def gain(self, value: float | None) -> float:
        """What the plan is worth beyond stopping now; without a value, any plan is worth making."""
        return math.inf if value is None else value * self.success - self.expected_cost

    def worth_trying(self, value: float | None) -> bool:
        return self.gain(value) > 0


def evaluate(
    options: Sequence[Option], already_failed: Sequence[str | Option] = (), task_sd: float = 0.0,
    noise: tuple[float, float] = EXACT,
) -> Plan:  # fmt: skip
    """The expected cost and success of trying ``options`` in order, after ``already_failed``
    (attempts the verifier rejected), judged by a verifier of error rates ``noise``.

    With a task effect every failure seen says how hard the task is, including failures of
    models outside this plan (as ``best_plan`` weighs them): such a model is given as its
    ``Option`` (its chance is needed); a name is enough for a model in the plan.
    """
    failed_names = [f.model if isinstance(f, Option) else f for f in already_failed]
    if task_sd > 0:
        distinct = list({o.model: o for o in options}.values())
        index = {d.model: i for i, d in enumerate(distinct)}
        seq = tuple(index[o.model] for o in options)
        known = {
            **{f.model: f for f in already_failed if isinstance(f, Option)},
            **{d.model: d for d in distinct},
        }
        unknown = [m for m in failed_names if m not in known]
        if unknown:
            raise ValueError(
                f"failed model(s) {', '.join(unknown)} not in the plan: pass their Option, so that the "
                "task effect can weigh their failure"
            )
        failed_options = [known[m] for m in dict.fromkeys(failed_names)]
        costs, successes = _score(
            distinct, _rows([seq], len(seq)), failed_names, task_sd, failed_options, noise
        )
        return Plan(tuple(o.model for o in options), float(costs[0]), float(successes[0]))
    fa, fr = noise
    failed = set(failed_names)
    cost, alive, success = 0.0, 1.0, 0.0
    for k, o in enumerate(options):
        p = o.p_success * (REPEAT_FACTOR if o.model in failed else 1.0)
        cost += alive * o.attempt_cost
        last = k == len(options) - 1
        success += alive * p * (1.0 if last else 1.0 - fr)
        alive *= p * fr + (1.0 - p) * (1.0 - fa)
        failed.add(o.model)
    # Exact: what is not alive at the end succeeded (the arithmetic as it was, to the last bit).
    return Plan(tuple(o.model for o in options), cost, success if fa > 0 or fr > 0 else 1.0 - alive)


def best_plan(
    options: Sequence[Option],
    *,
    attempts_left: int,
    already_failed: Sequence[str] = (),
    value: float | None = None,
    budget: float | None = None,
    allow_repeats: bool = True,
    task_sd: float = 0.0,
    noise: tuple[float, float] = EXACT,
) -> Plan:
    """The plan of one to ``attempts_left`` attempts worth most (``value · success − cost``),
    its attempts judged by a verifier of error rates ``noise`` (false accept, false reject).

    Stopping is the alternative: when the plan returned is not ``worth_trying(value)``, no
    attempt is. Without a value, the plan with the least cost per completed task. With a budget,
    plans whose expected cost exceeds it are dropped while any fits — a nearly spent budget
    steps down to cheaper models instead of failing.
    """
    if not options:
        raise ValueError("no options to plan over")
    failed = set(already_failed)
    failed_options = [o for o in options if o.model in failed]
    options = shortlist(options)
    rows = _sequences(len(options), max(1, attempts_left), allow_repeats)
    cost, success = _score(options, rows, already_failed, task_sd, failed_options, noise)
    i = _choose(cost, success, rows.lengths, budget, value)
    return Plan(
        tuple(options[j].model for j in rows.index[i, : rows.lengths[i]]), float(cost[i]), float(success[i])
    )


def outcomes_by_value(
    options: Sequence[Option], values: np.ndarray, *, attempts_left: int, task_sd: float = 0.0,
    already_failed: Sequence[str] = (), noise: tuple[float, float] = EXACT,
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:  # fmt: skip
    """Of the plan ``best_plan`` makes at each value: its expected success and cost (0 where it
    stops) and its first model (None: stop). Every plan is scored once, then chosen for every value
    at once (for calibrating a target over many tasks and values)."""
    failed_options = [o for o in options if o.model in already_failed]
    options = shortlist(options)
    rows = _sequences(len(options), max(1, attempts_left), True)
    cost, success = _score(options, rows, already_failed, task_sd, failed_options, noise)
    # Rounded as _choose rounds; ties go to the cheaper, then shorter, plan (lexsort's order).
    order = np.lexsort((rows.lengths, cost))
    worth = np.round(values[:, None] * success[None, order] - cost[None, order], 12)
    best = order[np.argmax(worth, axis=1)]
    go = worth.max(axis=1) > 0
    first = [options[rows.index[b, 0]].model if g else None for b, g in zip(best, go, strict=True)]
    return np.where(go, success[best], 0.0), np.where(go, cost[best], 0.0), first


@dataclass(frozen=True)
class _Rows:
    """Plans as index rows into the options, padded to the longest: every plan is scored at once
    (the per-plan Python loop this replaced cost ~0.3 ms per decision, ~0.7 ms with a task effect)."""

    index: np.ndarray  # (plans, longest) option indices
    lengths: np.ndarray  # (plans,)
    #: (plans, longest): the option at this position was already tried earlier in the plan.
    repeat: np.ndarray


def _rows(seqs: Sequence[Sequence[int]], longest: int) -> _Rows:
    index = np.zeros((len(seqs), longest), dtype=np.intp)
    repeat = np.zeros((len(seqs), longest), dtype=bool)
    for r, seq in enumerate(seqs):
        index[r, : len(seq)] = seq
        repeat[r, : len(seq)] = [i in seq[:j] for j, i in enumerate(seq)]
    return _Rows(index, np.array([len(s) for s in seqs], dtype=np.intp), repeat)


@functools.cache
def _sequences(k: int, n: int, allow_repeats: bool) -> _Rows:
    """Every plan of 1..n attempts over k options: shorter first, then in ``itertools.product``
    (or ``permutations``) order — the order ties are broken in."""
    idx = range(k)
    seqs = [
        seq
        for length in range(1, n + 1)
        for seq in (
            itertools.product(idx, repeat=length) if allow_repeats else itertools.permutations(idx, length)
        )
    ]
    rows = _rows(seqs, n)
    for shared in (rows.index, rows.lengths, rows.repeat):
        shared.flags.writeable = False  # one cached copy serves every decision
    return rows


def _score(
    options: Sequence[Option], rows: _Rows, already_failed: Sequence[str], task_sd: float,
    failed_options: Sequence[Option], noise: tuple[float, float] = EXACT,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Expected cost and success of every plan (``evaluate``'s arithmetic, in the same order).

    Without a task effect each plan is one product of chances to go on. With one, the products are
    taken per quadrature node of the task's difficulty, starting from what the rejections already
    seen say of it, and averaged.
    """
    fa, fr = noise
    failed = set(already_failed)
    if task_sd > 0:
        _, w = _quadrature(NODES)
        posterior = np.array(w)
        for o in failed_options:
            right = conditional_success(o.p_success, task_sd)
            posterior = posterior * (right * fr + (1.0 - right) * (1.0 - fa))
        posterior = posterior / posterior.sum() if posterior.sum() > 0 else np.array(w)
        p = np.array([conditional_success(o.p_success, task_sd) for o in options])  # (options, nodes)
    else:
        posterior = np.ones(1)
        p = np.array([[o.p_success] for o in options])
    costs = np.array([o.attempt_cost for o in options])
    was_failed = np.array([o.model in failed for o in options])
    noisy = fa > 0 or fr > 0
    alive = np.tile(posterior, (len(rows.index), 1))
    cost = np.zeros(len(rows.index))
    success = np.zeros(len(rows.index))
    for j in range(rows.index.shape[1]):
        k = rows.index[:, j]
        active = rows.lengths > j
        repeat = was_failed[k] | rows.repeat[:, j]
        right = p[k] * np.where(repeat, REPEAT_FACTOR, 1.0)[:, None]
        cost = np.where(active, cost + costs[k] * alive.sum(axis=1), cost)
        if noisy:
            # The plan's last attempt: its right result stands whatever the verdict.
            kept = np.where(rows.lengths == j + 1, 1.0, 1.0 - fr)
            success = np.where(active, success + kept * (alive * right).sum(axis=1), success)
            going = alive * (right * fr + (1.0 - right) * (1.0 - fa))
        else:  # what is not alive at the end succeeded (the arithmetic as it was, to the last bit)
            going = alive * (1.0 - right)
        alive = np.where(active[:, None], going, alive)
    return cost, success if noisy else 1.0 - alive.sum(axis=1)


def _choose(
    cost: np.ndarray,
    success: np.ndarray,
    lengths: np.ndarray,
    budget: float | None,
    value: float | None,
) -> int:
    """The row ``best_plan`` picks; among equal keys the shortest, then the cheapest, then the first."""
    ok = np.ones(len(cost), dtype=bool) if budget is None else cost <= budget
    if not ok.any():  # nothing within the budget: the cheapest plan
        return int(np.argmin(cost))
    rows = np.flatnonzero(ok)
    s, c = success[rows], cost[rows]
    if value is not None:
        # Rounded, so that orders of the same models (equal but for rounding) tie on worth.
        key = -np.round(value * s - c, 12)
    else:
        key = np.divide(c, s, out=np.full(len(rows), np.inf), where=s > 0)
    return int(rows[np.lexsort((lengths[rows], c, key))[0]])


def shortlist(options: Sequence[Option], k: int = 7) -> Sequence[Option]:
    """The options worth enumerating: the best by cost per success, the strongest, the cheapest.

    Enumeration grows as k**attempts; a model that is neither efficient, strong nor cheap never
    appears in an optimal plan in practice, so a short list keeps planning in microseconds.
    """
    if len(options) <= k:
        return options
    keep: dict[str, Option] = {}
    by_ratio = sorted(options, key=lambda o: o.attempt_cost / max(o.p_success, 1e-9))
    by_p = sorted(options, key=lambda o: -o.p_success)
    by_cost = sorted(options, key=lambda o: o.attempt_cost)
    for o in [*by_ratio[: k - 3], *by_p[:2], by_cost[0]]:
        keep.setdefault(o.model, o)
    return list(keep.values())


@functools.cache
def _quadrature(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Nodes and weights for E[f(u)], u ~ N(0, 1)."""
    u, w = np.polynomial.hermite_e.hermegauss(n)
    return tuple(u.tolist()), tuple((w / w.sum()).tolist())


def conditional_success(p: float, task_sd: float) -> np.ndarray:
    """P(success | u) at the quadrature nodes, for a model whose success averaged over tasks like this is ``p``.

    The logit is stretched so that averaging over ``u`` gives back ``p`` (the logistic-normal
    approximation ``E σ(a + s·u) ≈ σ(a / sqrt(1 + π s²/8))``).
    """
    u, _ = _quadrature(NODES)
    p = min(max(p, 1e-6), 1 - 1e-6)
    a = math.log(p / (1 - p)) * math.sqrt(1 + math.pi * task_sd**2 / 8)
    return 1.0 / (1.0 + np.exp(-(a + task_sd * np.array(u))))
