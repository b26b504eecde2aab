"""Cross-validation (or train/test): the policy, its frontier, the baselines and the oracle per fold.

Per fold the router is trained on the training tasks only and replayed on the test tasks. Whatever
is chosen — the value of a completed task for a success target, the cheap-end operating point, each
baseline's cascade or threshold — is chosen on the training tasks and only then read on the test
tasks. The policy runs under the objective the flags give, as the live router would with its policy
file: its prior plan (the best fixed order on the training tasks for that value or target, under the
same verifier noise) and the margin for leaving it come from the artifact `router train` wrote from
the training tasks (``router.learning.training.value``), whose replays plan on out-of-fold
probabilities (replaying on the fit's own probabilities is optimistic: a value chosen that way missed
its target on the test folds by 5–10 points). Folds run in parallel processes when there is more than one.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from router.features.tokens import TokenCounter
from router.learning.evals import baselines as bl
from router.learning.evals.arrival import Arrival, arrive
from router.learning.evals.deploy import Deployment, Knobs, Router, price_decider, train
from router.learning.evals.loader import DataError, Dataset
from router.learning.evals.simulate import EXACT, Chooser, Verifier, replay
from router.learning.evals.summary import combine, summarize

#: The policy's trade-off sweep: the value of a completed task, in USD.
FRONTIER: tuple[float, ...] = tuple(round(float(v), 4) for v in np.geomspace(0.01, 30.0, 15))
TARGETS = (0.65, 0.70, 0.75, 0.80)
STRONG_SHARES = (0.1, 0.25, 0.5, 0.75)
#: The cheap-end reference: the cheapest model (per task, on the training tasks) resolving over this.
REFERENCE_MIN_RESOLVED = 0.55
#: The cheap-end operating point: at most this times the reference's cost per task.
CHEAP_END_COST_RATIO = 1.1
#: Target (a): the default single shot at no more than this times the best single model's cost per task.
DEFAULT_COST_RATIO = 1.05
#: Target (b): at most this times the cascade's cost per completed task.
CASCADE_COST_RATIO = 1.05
#: always-cheapest chooses among the models resolving at least this share of the training tasks.
COMPETENT = 0.40
#: Longest cascade enumerated (24 models: 12k sequences of three).
MAX_CASCADE = 3


@dataclass(frozen=True)
class EvalSettings:
    retries: int = 0
    folds: int = 5
    seed: int = 0
    #: The objective of the ``policy`` row: a value in USD, or a success target (calibrated), or neither.
    value: float | None = None
    target_success: float | None = None
    max_cost_per_task: float | None = None
    #: (false accept, false reject) of the verifier the policy learns outcomes through.
    noise: tuple[float, float] = (0.0, 0.0)
    frontier: tuple[float, ...] = FRONTIER
    targets: tuple[float, ...] = TARGETS
    strong_shares: tuple[float, ...] = STRONG_SHARES
    workers: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.noise[0], self.noise[1], self.seed)


@dataclass
class FoldResult:
    policy: dict[str, Any]
    policy_value: float | None
    #: (value, test metrics), one per frontier value; and the same at no noise when there is noise.
    frontier: list[dict[str, Any]]
    frontier_exact: list[dict[str, Any]]
    #: name → (test metrics, what was chosen on the training tasks)
    operating: dict[str, tuple[dict[str, Any], str]]
    baselines: dict[str, dict[str, Any]]
    chosen: dict[str, str]
    oracle: dict[str, Any]
    reference: str
    task_sd: float = 0.0
    fit_metrics: dict[str, Any] = field(default_factory=dict)


def split(task_ids: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    """Deterministic folds: a seeded shuffle dealt round-robin."""
    if folds < 2:
        raise ValueError("cross-validation needs at least 2 folds")
    if folds > len(task_ids):
        raise ValueError(f"{folds} folds for {len(task_ids)} tasks: at most one fold per task")
    ids = sorted(task_ids)
    random.Random(seed).shuffle(ids)
    return [ids[i::folds] for i in range(folds)]


def arrivals_for(data: Dataset) -> dict[str, Arrival]:
    counter = TokenCounter()
    return {t.id: arrive(t, counter) for t in data.tasks}


def reference_model(data: Dataset, train_ids: Sequence[str]) -> str:
    rates = bl.training_rates(data, train_ids)
    good = [m for m, (p, _) in rates.items() if p > REFERENCE_MIN_RESOLVED] or list(rates)
    return min(good, key=lambda m: rates[m][1])


def value_within(curve: Sequence[Sequence[float]], cap: float) -> float | None:
    """The largest value on the curve whose expected cost per task stays within ``cap``."""
    fits = [v for v, _, cost in curve if cost <= cap]
    return max(fits) if fits else None


def evaluate_fold(
    data: Dataset, train_ids: Sequence[str], test_ids: Sequence[str], settings: EvalSettings,
    arrivals: Mapping[str, Arrival] | None = None,
) -> FoldResult:  # fmt: skip
    """Train on ``train_ids``, replay everything on ``test_ids``. ``data`` holds both sets of tasks."""
    arrivals = arrivals if arrivals is not None else arrivals_for(data)
    k = settings.retries
    models = data.model_ids
    noisy = settings.verifier

    def run(choose: Chooser, ids: Sequence[str], verifier: Verifier = noisy) -> dict[str, Any]:
        return summarize(replay(data, ids, choose, k, verifier, budget=settings.max_cost_per_task), models)

    with threadpool_limits(1), tempfile.TemporaryDirectory(prefix="router-eval-") as tmp:
        # Small sparse fits: BLAS threads only contend on a shared 2-core machine.
        artifact = train(
            data,
            train_ids,
            arrivals,
            max_attempts=k + 1,
            target=settings.target_success,
            noise=settings.noise,
        )
        dep = Deployment(data, artifact, Path(tmp))
        routers: dict[tuple[float | None, float | None], Router] = {}

        def router(value: float | None, target: float | None = None) -> Router:
            if (value, target) not in routers:
                knobs = Knobs(max_attempts=k + 1, value=value, target_success=target,
                              max_cost_per_task=settings.max_cost_per_task)  # fmt: skip
                routers[value, target] = Router(dep.decider(knobs), arrivals, settings.max_cost_per_task)
            return routers[value, target]

        def described(r: Router) -> str:
            o = r.scorer.objective if r.scorer is not None else None
            if o is None or o.value is None:
                return "no value"
            prior = " → ".join(o.prior or ()) or "stop"
            margin = "never leaves it" if o.margin == float("inf") else f"margin {o.margin:g}·V"
            return f"value={o.value:.4g}, prior {prior}, {margin}"

        curve = dep.artifact.value_curves[k + 1]
        main = router(settings.value, settings.target_success)
        value = main.scorer.objective.value if main.scorer is not None else settings.value
        policy = run(main, test_ids)
        frontier = [{"value": v, **run(router(v), test_ids)} for v in settings.frontier]
        exact = (
            [{"value": v, **run(router(v), test_ids, EXACT)} for v in settings.frontier]
            if noisy != EXACT
            else []
        )
        operating: dict[str, tuple[dict[str, Any], str]] = {}
        ref = reference_model(data, train_ids)
        rates = bl.training_rates(data, train_ids)
        cheap = value_within(curve, CHEAP_END_COST_RATIO * rates[ref][1])
        if cheap is not None:
            operating["cheap_end"] = (run(router(cheap), test_ids), described(router(cheap)))
        for target in settings.targets:
            r = router(None, target)
            operating[f"target_{target:.2f}"] = (run(r, test_ids), described(r))

    base: dict[str, dict[str, Any]] = {}
    chosen: dict[str, str] = {}
    for m in models:
        base[f"single:{m}"] = run(bl.sequence([m]), test_ids)
    base["random"] = run(bl.uniform_random(models, settings.seed), test_ids)
    cheapest = price_decider(data.models)
    able = set(bl.competent(data, train_ids, COMPETENT))
    orders = {t: [m for m in bl.price_order(cheapest, arrivals[t]) if m in able] for t in test_ids}
    base["always-cheapest"] = run(bl.first_untried_per_task(orders), test_ids)
    chosen["always-cheapest"] = f"{len(able)} models resolving ≥ {COMPETENT:.0%}"
    best = bl.least_cost_per_completed(data, train_ids)
    base["best-single"] = run(bl.sequence([best]), test_ids)
    chosen["best-single"] = best
    strong = bl.strongest_order(data, train_ids)
    base["always-strongest"] = run(bl.first_untried(strong), test_ids)
    chosen["always-strongest"] = strong[0]
    threshold = bl.ThresholdRouter(data, train_ids, arrivals, weak=ref, strong=strong[0])
    for share in settings.strong_shares:
        name = f"routellm@{share:.0%}"
        base[name] = run(threshold.chooser(share), test_ids)
        chosen[name] = f"{ref} | {strong[0]}"
    cands = bl.cascades(data, train_ids, min(k + 1, MAX_CASCADE), noisy)
    for floor in (None, *settings.targets):
        c = bl.best_cascade(cands, floor)
        name = "cascade" if floor is None else f"cascade@{floor:.0%}"
        base[name] = run(bl.sequence(c.models), test_ids)
        chosen[name] = c.name
    oracle = run(bl.oracle(data), test_ids, EXACT)
    metrics = artifact.report["metrics"]
    fit_metrics = {k_: metrics.get(k_) for k_ in ("brier", "brier_base_rate", "auc", "pairwise")}
    return FoldResult(policy, value, frontier, exact, operating, base, chosen, oracle, ref, artifact.task_sd,
                      fit_metrics)  # fmt: skip


def _fold_job(args: tuple[Dataset, list[str], list[str], EvalSettings]) -> FoldResult:
    data, train_ids, test_ids, settings = args
    return evaluate_fold(data, train_ids, test_ids, settings)


def cross_validate(data: Dataset, settings: EvalSettings) -> dict[str, Any]:
    folds = split(data.task_ids, settings.folds, settings.seed)
    jobs = [(data, [t for t in data.task_ids if t not in set(test)], test, settings) for test in folds]
    if settings.workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=settings.workers) as pool:
            results = list(pool.map(_fold_job, jobs))
    else:
        arrivals = arrivals_for(data)
        results = [evaluate_fold(d, tr, te, s, arrivals) for d, tr, te, s in jobs]
    return assemble(results, settings, mode=f"{settings.folds}-fold cross-validation", data=data)


def train_test(train_data: Dataset, test_data: Dataset, settings: EvalSettings) -> dict[str, Any]:
    if train_data.model_ids != test_data.model_ids:
        raise DataError(
            f"{test_data.source}: models differ from {train_data.source}: "
            f"{sorted(set(train_data.model_ids) ^ set(test_data.model_ids))}"
        )
    clash = {t.id for t in train_data.tasks} & {t.id for t in test_data.tasks}
    if clash:
        raise DataError(
            f"{test_data.source}: {len(clash)} task(s) also in the training data, e.g. {min(clash)}"
        )
    both = Dataset(
        f"{train_data.source}+{test_data.source}",
        [*train_data.tasks, *test_data.tasks],
        train_data.models,
        {**train_data.outcomes, **test_data.outcomes},
    )
    result = evaluate_fold(both, train_data.task_ids, test_data.task_ids, settings)
    return assemble([result], settings, mode=f"train {train_data.source}, test {test_data.source}", data=both)


def assemble(
    results: Sequence[FoldResult], settings: EvalSettings, *, mode: str, data: Dataset
) -> dict[str, Any]:
    """Fold results → the report object: policy, baselines, oracle, frontier (pooled, ± std)."""
    policy = combine([r.policy for r in results])
    policy["objective"] = {
        "max_attempts": settings.retries + 1, "value_per_completed_usd": settings.value,
        "target_success": settings.target_success, "max_cost_per_task": settings.max_cost_per_task,
        "value_chosen_on_training": [r.policy_value for r in results],
    }  # fmt: skip
    operating: dict[str, Any] = {}
    for name in results[0].operating:
        got = [r.operating[name] for r in results if name in r.operating]
        point = combine([g[0] for g in got])
        point["chosen_on_training"] = [g[1] for g in got]
        point["folds_with_a_point"] = len(got)
        operating[name] = point
    policy["operating_points"] = operating
    baselines = {}
    for name in results[0].baselines:
        b = combine([r.baselines[name] for r in results])
        if name in results[0].chosen:
            b["chosen_on_training"] = [r.chosen[name] for r in results]
        baselines[name] = b

    def sweep(points: Callable[[FoldResult], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        if not points(results[0]):
            return []
        return [
            {"value": v, **combine([points(r)[i] for r in results])} for i, v in enumerate(settings.frontier)
        ]

    refs = sorted({r.reference for r in results})
    policy["setup"] = {
        "mode": mode, "data": data.source, "tasks": len(data.tasks), "models": len(data.models),
        "retries": settings.retries, "folds": len(results), "seed": settings.seed, "reference_model": refs,
        "verifier_noise": list(settings.noise), "task_effect_sd": [r.task_sd for r in results],
        "fit_metrics": [r.fit_metrics for r in results],
    }  # fmt: skip
    report = {
        "policy": policy,
        "baselines": baselines,
        "oracle": combine([r.oracle for r in results]),
        "frontier": sweep(lambda r: r.frontier),
    }
    if results[0].frontier_exact:
        report["frontier_exact"] = sweep(lambda r: r.frontier_exact)
    policy["targets"] = targets(report, settings)
    return report


def targets(report: dict[str, Any], settings: EvalSettings) -> dict[str, Any]:
    """The issue's targets, checked on the numbers above (test folds only, pooled)."""
    out: dict[str, Any] = {}
    ops = report["policy"]["operating_points"]
    default = settings.value is None and settings.target_success is None
    if settings.retries == 0 and default:
        # (a): the default single shot never loses to the best single model chosen on the training folds.
        ref = report["baselines"]["best-single"]
        p = report["policy"]
        out["a_default"] = {
            "reference": sorted(set(ref.get("chosen_on_training") or [])),
            "reference_resolved_rate": ref["resolved_rate"],
            "reference_cost_per_task": ref["cost_per_task"],
            "policy_resolved_rate": p["resolved_rate"],
            "policy_cost_per_task": p["cost_per_task"],
            "resolved_gain_points": 100 * (p["resolved_rate"] - ref["resolved_rate"]),
            "cost_ratio": p["cost_per_task"] / ref["cost_per_task"] if ref["cost_per_task"] else None,
            "met": p["resolved_rate"] >= ref["resolved_rate"]
            and p["cost_per_task"] <= DEFAULT_COST_RATIO * ref["cost_per_task"],
        }
    if settings.retries > 0:
        rows = []
        for target in settings.targets:
            c = report["baselines"][f"cascade@{target:.0%}"]
            p = ops[f"target_{target:.2f}"]
            ratio = p["cost_per_completed"] / c["cost_per_completed"]
            rows.append({
                "target": target,
                "cascade": (c.get("chosen_on_training") or [""])[0],
                "cascade_resolved_rate": c["resolved_rate"],
                "cascade_cost_per_completed": c["cost_per_completed"],
                "policy_resolved_rate": p["resolved_rate"],
                "policy_cost_per_completed": p["cost_per_completed"],
                "cost_ratio": ratio,
                "met": bool(p["resolved_rate"] >= c["resolved_rate"] and ratio <= CASCADE_COST_RATIO),
            })  # fmt: skip
        key = "c_noisy_cascades" if any(settings.noise) else "b_cascades"
        out[key] = {
            "verifier_noise": list(settings.noise),
            "targets": rows,
            "met": all(r["met"] for r in rows),
        }
    return out
