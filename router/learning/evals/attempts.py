"""Control inside the attempt, cross-validated: caps, stop-loss and escalation against fixed cascades.

Per fold, on the training tasks only: the label model is fitted on the training trajectories (its
readings of a training run come from a model fitted without that task, its readings of a test run
from the one fitted on every training run); each model's call cap and stop-loss threshold and the
order of up to N models are chosen by the objective (``router.learning.training.control.learn``:
the least cost per completed task among orders reaching the target). The trajectories fitted on
and those the test folds replay may come from two sources (``--trajectories``,
``--test-trajectories``): fitting reads only the first, and only its runs of the fold's training
tasks; the test replay reads only the second, and only its runs of the fold's test tasks. Under a noisy verifier the
policy learns from the verdicts, not the true outcomes: what a deployment's log would hold.

Then on the test tasks, with the same verifier for every row: the policy (its order, caps and
stop-loss), the same with each stop-loss replaced by a random stop of the same share at the same
calls (trained share, seeded draws), and the baselines from a full grid search on the training
tasks — the best fixed cascade of up to 3 and up to N attempts, and of up to N with the same caps.
Baselines are chosen on the training tasks' true outcomes (with the verifier's expected verdicts):
they are given more than the policy, never less.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from threadpoolctl import threadpool_limits

from router.features.task.attempt import AttemptControl
from router.learning.evals import baselines as bl
from router.learning.evals import turns as trajectories
from router.learning.evals.loader import Dataset
from router.learning.evals.runner import split
from router.learning.evals.simulate import Execution, Judge, LabelVerifier, Verifier, replay
from router.learning.evals.summary import combine, summarize
from router.learning.training import control, verdicts

TARGETS = (0.75, 0.80)
#: Targets of the frontier plot (each row re-chosen on the training folds for each).
SWEEP = (0.7, 0.75, 0.8)


@dataclass(frozen=True)
class ControlSettings:
    retries: int = 3
    folds: int = 5
    seed: int = 0
    targets: tuple[float, ...] = TARGETS
    #: "exact": outcomes as recorded; "labels": the label model judges runs with a trajectory.
    verifier: str = "exact"
    noise: tuple[float, float] = (0.0, 0.0)
    #: The shortest cascade the targets are stated against.
    reference_attempts: int = 3
    workers: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))


def _runs(
    data: Dataset, ids: Sequence[str], known: Mapping[tuple[str, str], trajectories.Turns],
    readings: trajectories.Readings | None,
) -> dict[str, dict[str, control.Run]]:  # fmt: skip
    out: dict[str, dict[str, control.Run]] = {m: {} for m in data.model_ids}
    for m in data.model_ids:
        for t in ids:
            o = data.outcome(t, m)
            k = known.get((t, m))
            if k is None:
                out[m][t] = control.Run(o.resolved, o.cost, o.calls)
            else:
                p = readings.before.get((t, m)) if readings is not None else None
                out[m][t] = control.Run(o.resolved, o.cost, o.calls, k.costs, None if p is None else tuple(p))
    return out


def _as_judged(
    runs: Mapping[str, Mapping[str, control.Run]], judge: Judge, noise: tuple[float, float],
    verdicts: Mapping[tuple[str, str], bool],
) -> dict[str, dict[str, control.Run]]:  # fmt: skip
    """The runs as the router's log would hold them: each outcome as the verifier said it, with the
    chance it was right that the verifier's known error rates give (what the router may know of
    its verifier: the noise rates, and the label model's precision on the training runs)."""
    fa, fr = noise
    judged = [(r.resolved, v) for (t, m), v in verdicts.items() for r in [runs[m][t]]]
    precision = _share([ok for ok, v in judged if v])
    missed = _share([ok for ok, v in judged if not v])
    out: dict[str, dict[str, control.Run]] = {}
    for m, by in runs.items():
        out[m] = {}
        for t, r in by.items():
            v = judge.accepts(t, 1, m, r.resolved)
            # Elsewhere unbiased for the share right: E[v] = s(1 − FR) + (1 − s)FA.
            p = (precision if v else missed) if (t, m) in verdicts else (float(v) - fa) / (1.0 - fa - fr)
            out[m][t] = dataclasses.replace(r, resolved=v, p_right=p)
    return out


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _judging(
    runs: Mapping[str, Mapping[str, control.Run]], verdicts: Mapping[tuple[str, str], bool]
) -> control.Judging:  # fmt: skip
    """The label verifier's verdicts as the planner's acceptance chances (it reads the conversation,
    not the result: the same verdict whether the result was right or not)."""
    return {(t, m): (float(v), float(v)) for (t, m), v in verdicts.items() if m in runs}


@dataclass
class Fold:
    rows: dict[str, dict[str, Any]]
    chosen: dict[str, str]
    learned: dict[str, Any]
    sweep: dict[str, list[dict[str, Any]]]
    #: (task, model) of the runs the label model and the stop rule were fitted on, and of those
    #: the test replay read: what the report says each fold used (and a leak would show in).
    fitted_on: frozenset[tuple[str, str]] = frozenset()
    replayed: frozenset[tuple[str, str]] = frozenset()


Known = Mapping[tuple[str, str], trajectories.Turns]


def fold_trajectories(
    train_source: Known, test_source: Known, train_ids: Sequence[str], test_ids: Sequence[str]
) -> tuple[dict[tuple[str, str], trajectories.Turns], dict[tuple[str, str], trajectories.Turns]]:
    """(runs to fit on, runs the test replay reads): a test task's run is never fitted on, even
    when the training source holds it (one file for both is the common case)."""
    train_set, test_set = set(train_ids), set(test_ids)
    if train_set & test_set:
        raise ValueError("a task is in both the training and the test folds")
    return (
        {k: v for k, v in train_source.items() if k[0] in train_set},
        {k: v for k, v in test_source.items() if k[0] in test_set},
    )


def evaluate_fold(
    data: Dataset, train_ids: Sequence[str], test_ids: Sequence[str], known: Known, s: ControlSettings,
    test_source: Known | None = None,
) -> Fold:  # fmt: skip
    """One fold. ``known``: the trajectories fitted on; ``test_source``: those the test replay
    reads (default: the same)."""
    n = s.retries + 1
    noise = Verifier(s.noise[0], s.noise[1], s.seed)
    train_known, test_known = fold_trajectories(
        known, known if test_source is None else test_source, train_ids, test_ids
    )
    with threadpool_limits(1):
        oof = trajectories.out_of_fold(train_known, seed=s.seed) if train_known else None
        fitted = trajectories.label_model(list(train_known.values())) if train_known else None
    test_read = trajectories.readings(test_known, fitted) if fitted is not None else None
    true_train = _runs(data, train_ids, train_known, oof)
    test_runs = _runs(data, test_ids, test_known, test_read)
    judge: Judge = noise
    train_judge: Judge = noise
    judging: control.Judging | None = None
    train_verdicts: dict[tuple[str, str], bool] = {}
    if s.verifier == "labels" and oof is not None and test_read is not None:
        judge = LabelVerifier({k: p >= test_read.threshold for k, p in test_read.final.items()}, noise)
        train_verdicts = {k: p >= oof.threshold for k, p in oof.final.items()}
        train_judge = LabelVerifier(train_verdicts, noise)
        judging = _judging(true_train, train_verdicts)
    noisy = s.verifier == "labels" or any(s.noise)
    # The policy learns from what its log holds: verdicts under a noisy verifier.
    policy_train = _as_judged(true_train, train_judge, s.noise, train_verdicts) if noisy else true_train
    # Under a verifier of known error rates, each run is read with every model's verdict on its
    # task (``verdicts``): one verdict alone is too noisy to choose among orders on.
    planned = (
        verdicts.rows(policy_train, train_ids, s.noise)
        if any(s.noise) and judging is None
        else verdicts.plain(policy_train, train_ids)
    )
    # The inner cross-validation reads each inner fold's verdicts apart (no left-out task's
    # verdict shapes the order it is scored on).
    inner = (
        verdicts.inner_margin(policy_train, train_ids, s.noise, n, seed=s.seed)
        if any(s.noise) and judging is None
        else None
    )
    known_test = {(t, m): r for m, by in test_runs.items() for t, r in by.items() if r.call_costs is not None}

    def run(plan: Sequence[str], execution: Execution) -> dict[str, Any]:
        return summarize(
            replay(data, test_ids, bl.sequence(plan), s.retries, judge, execution), data.model_ids
        )

    def cascade(
        length: int, target: float, ctrls: Mapping[str, AttemptControl], runs: control.Runs = true_train
    ) -> tuple[str, ...]:  # fmt: skip
        tbl = control.table(runs, train_ids, ctrls, judging, exact_noise=s.noise)
        o = control.orders(tbl, length)
        return o.names(o.best(target))

    def on_true_outcomes(plan: Sequence[str], ctrls: Mapping[str, AttemptControl]) -> float:
        """The share of the training tasks ``plan`` resolves on their true outcomes, judged by the
        verifier (in expectation): what the policy, reading verdicts, estimated it at."""
        tbl = control.table(true_train, train_ids, ctrls, judging, exact_noise=s.noise)
        return control.scored(tbl, [tbl.models.index(m) for m in plan])[0]

    # Under a noisy verifier, the most any fixed order of up to n resolves on the training tasks'
    # true outcomes: where the verdicts put a target within reach and it is out of it, the policy
    # buys the cheapest order that seems to reach it while the cascade chosen on the outcomes (the
    # reference of target (d)) resolves all it can. The report says which happened, per fold.
    reachable = None
    if noisy:
        every = control.orders(control.table(true_train, train_ids, {}, judging, exact_noise=s.noise), n)
        reachable = float(every.resolved.max()) if len(every.resolved) else 0.0
    rows: dict[str, dict[str, Any]] = {}
    chosen: dict[str, str] = {}
    learned_out: dict[str, Any] = {}
    sweep: dict[str, list[dict[str, Any]]] = {"cascade": [], "cascade+caps": [], "policy": []}
    if noisy:
        sweep["cascade, chosen on verdicts"] = []
    for target in sorted({*s.targets, *SWEEP}):
        learned = control.learn(
            planned.runs, planned.ids, n, target, judging, s.noise, seed=s.seed, weights=planned.weights,
            task_of=planned.task_of, inner=inner,
        )  # fmt: skip
        caps = {m: AttemptControl(max_calls=c.max_calls) for m, c in learned.controls.items()}
        plans = {
            f"cascade{s.reference_attempts}": (cascade(s.reference_attempts, target, {}), {}),
            f"cascade{n}": (cascade(n, target, {}), {}),
            f"cascade{n}+caps": (cascade(n, target, caps), caps),
            "policy": (learned.plan, learned.controls),
        }
        if noisy:
            # The cascade a deployment could choose: on its log's verdicts, as the policy is.
            plans[f"cascade{n}, chosen on verdicts"] = (cascade(n, target, {}, policy_train), {})
        got = {name: run(plan, Execution(ctrls, known_test)) for name, (plan, ctrls) in plans.items()}
        stopping = {m: c for m, c in learned.controls.items() if c.stop_below is not None}
        if stopping:
            rnd = {}
            for m, c in stopping.items():
                r = control.matched_random_stop(planned.runs[m], c, s.seed)
                if r is not None:
                    rnd[m] = r
            got["policy, random stop"] = run(learned.plan, Execution(caps, known_test, rnd))
            plans["policy, random stop"] = plans["policy"]
        else:
            got["policy, random stop"] = got["policy"]
            plans["policy, random stop"] = plans["policy"]
        sweep["cascade"].append({"target": target, **got[f"cascade{n}"]})
        sweep["cascade+caps"].append({"target": target, **got[f"cascade{n}+caps"]})
        sweep["policy"].append({"target": target, **got["policy"]})
        if noisy:
            sweep["cascade, chosen on verdicts"].append(
                {"target": target, **got[f"cascade{n}, chosen on verdicts"]}
            )
        if target not in s.targets:
            continue
        for name, metrics in got.items():
            rows[f"{name}@{target:.0%}"] = metrics
            chosen[f"{name}@{target:.0%}"] = " → ".join(plans[name][0])
        learned_out[f"{target:.2f}"] = {
            "stop_loss": {m: c.stop_below for m, c in learned.controls.items() if c.stop_below is not None},
            "caps": {m: c.max_calls for m, c in learned.controls.items()},
            "stop_loss_trials": learned.report,
            # Chosen at target + margin (inner cross-validation on the training tasks).
            "margin": learned.margin,
            "longest": learned.longest,
            "held_out": {f"{k}@{m:.3f}": r for (k, m), r in learned.held_out.items()},
        }
        if reachable is not None:
            learned_out[f"{target:.2f}"]["on_training"] = {
                "estimated": learned.resolved,
                "true": on_true_outcomes(learned.plan, learned.controls),
                "best_fixed": reachable,
            }
    return Fold(rows, chosen, learned_out, sweep, frozenset(train_known), frozenset(test_known))


def _job(
    args: tuple[Dataset, list[str], list[str], dict[tuple[str, str], trajectories.Turns], ControlSettings,
                dict[tuple[str, str], trajectories.Turns] | None],
) -> Fold:  # fmt: skip
    return evaluate_fold(*args)


def cross_validate(
    data: Dataset, known: Known, s: ControlSettings, test_known: Known | None = None
) -> dict[str, Any]:  # fmt: skip
    """``known``: the trajectories the stop rule is fitted on (``--trajectories``); ``test_known``:
    those the replay reads on the test folds (``--test-trajectories``; default the same)."""
    folds = split(data.task_ids, s.folds, s.seed)
    test = None if test_known is None else dict(test_known)
    jobs = [(data, [t for t in data.task_ids if t not in set(f)], f, dict(known), s, test) for f in folds]
    if s.workers > 1:
        with ProcessPoolExecutor(max_workers=s.workers) as pool:
            results = list(pool.map(_job, jobs))
    else:
        results = [_job(j) for j in jobs]
    rows = {name: combine([r.rows[name] for r in results]) for name in results[0].rows}
    for name in rows:
        rows[name]["chosen_on_training"] = [r.chosen[name] for r in results]
    sweep = {
        name: [
            {"target": pt["target"], **combine([r.sweep[name][i] for r in results])}
            for i, pt in enumerate(results[0].sweep[name])
        ]
        for name in results[0].sweep
    }
    return {
        "setup": {
            "folds": s.folds,
            "seed": s.seed,
            "retries": s.retries,
            "verifier": s.verifier,
            "verifier_noise": list(s.noise),
            "tasks": len(data.tasks),
            "models": len(data.models),
            "trajectories": len(known),
            "test_trajectories": len(known if test_known is None else test_known),
            # Per fold: runs fitted on (training tasks only) and runs the test replay read.
            "trajectories_fitted": [len(r.fitted_on) for r in results],
            "trajectories_replayed": [len(r.replayed) for r in results],
        },
        "rows": rows,
        "learned": [r.learned for r in results],
        "sweep": sweep,
        "targets": checks(rows, s),
    }


#: Target (b): at most this times the 3-attempt cascade's cost per completed task, at most 1 point fewer.
B_RATIO, C_RATIO, POINTS = 0.70, 0.75, 0.01


def _not_below(p: Mapping[str, Any], c: Mapping[str, Any]) -> bool:
    """At most the cascade's cost per completed task, at most a point fewer resolved."""
    return bool(p["cost_per_completed"] <= c["cost_per_completed"] * 1.0001
                and p["resolved_rate"] >= c["resolved_rate"] - POINTS)  # fmt: skip


def checks(rows: Mapping[str, Mapping[str, Any]], s: ControlSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    n = s.retries + 1
    ref = f"cascade{s.reference_attempts}"
    for target in s.targets:
        p, c = rows[f"policy@{target:.0%}"], rows[f"{ref}@{target:.0%}"]
        ratio = p["cost_per_completed"] / c["cost_per_completed"]
        d = rows[f"cascade{n}@{target:.0%}"]
        seen = rows.get(f"cascade{n}, chosen on verdicts@{target:.0%}")
        bound = B_RATIO if target >= 0.8 else C_RATIO
        out[f"{target:.2f}"] = {
            "policy_resolved": p["resolved_rate"], "policy_cost_per_completed": p["cost_per_completed"],
            "reference_resolved": c["resolved_rate"], "reference_cost_per_completed": c["cost_per_completed"],
            "ratio": ratio, "bound": bound,
            "met": bool(ratio <= bound and p["resolved_rate"] >= c["resolved_rate"] - POINTS),
            # (d): never below the best fixed cascade of as many attempts, judged by the same verifier.
            "not_below_cascade": _not_below(p, d),
            # The same against the cascade chosen on the same verdicts the policy learned from.
            "not_below_cascade_on_verdicts": None if seen is None else _not_below(p, seen),
        }  # fmt: skip
    return out
