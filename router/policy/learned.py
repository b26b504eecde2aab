"""The learned policy: a trained artifact (data, not code) and the scorer that uses it (its
objective and answers: ``router.policy.objective``, re-exported here).

The artifact is JSON: per model, logistic weights over the task features (``router.features.task.vector``)
with a Platt calibration for P(success), and a log-linear model of an attempt's cost. It records
its feature schema, the data it was trained on, its metrics, the fixed orders of models no other
beats on the training log (the prior plans, ``router.policy.prior``), the operating points (per
value and target: the margin a task's own plan must clear to leave the prior plan) and the value
curve (what share of the training tasks the policy expects to complete at each value of a
completed task). The scorer follows what is left of the prior plan unless the task's own plan
clears the margin. The policy file pins it by sha256; a changed file,
an older format or a different feature schema is refused with an error saying which. Nothing is
unpickled, ever.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from router.errors import ConfigError
from router.features.request import Features
from router.features.task.attempt import AttemptControl
from router.features.task.vector import HASH_DIM, NUMERIC, arrays, dot, schema, with_attempt
from router.policy import prior as priors
from router.policy.estimates import Estimates
from router.policy.objective import Choice, Next, Objective
from router.policy.plan import Option, Plan, best_plan, evaluate

__all__ = [
    "FORMAT",
    "Artifact",
    "Choice",
    "LearnedScorer",
    "ModelParams",
    "Next",
    "Objective",
    "ScopeEffects",
]

FORMAT = "router-learned/3"
#: Calls in an agent attempt, assumed for a model the log has not seen yet.
TYPICAL_CALLS = 20
#: Plans remembered per scorer (one per task attempt in flight is enough; entries are small).
PLAN_MEMORY = 4096


@dataclass(frozen=True, slots=True)
class ModelParams:
    weights: tuple[float, ...]
    platt: tuple[float, float]
    #: log(attempt cost in USD) = cost_weights · numeric features (dense part only).
    cost_weights: tuple[float, ...]
    calls_per_attempt: float
    n: int

    def p_success(self, vec: Mapping[int, float]) -> float:
        z = dot(self.weights, vec)
        a, b = self.platt
        return _sigmoid(a * z + b)

    def attempt_cost(self, vec: Mapping[int, float]) -> float:
        k = len(self.cost_weights)
        return math.exp(sum(self.cost_weights[i] * v for i, v in vec.items() if i < k))


@dataclass(frozen=True)
class Artifact:
    sha256: str
    models: dict[str, ModelParams]
    schema: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    #: Spread of the unseen per-task difficulty on the logit scale (0: failures independent).
    task_sd: float = 0.0
    #: max_attempts → ((value, expected share of training tasks completed), ...), value ascending.
    value_curves: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    #: Scope name → its learned effects (``router.learning.training.scopes``): only the kept ones.
    scopes: dict[str, ScopeEffects] = field(default_factory=dict)

    #: max_attempts → the fixed orders no other beats on the training log (``router.policy.prior``).
    frontiers: dict[int, tuple[priors.FixedPlan, ...]] = field(default_factory=dict)
    #: max_attempts → operating points (prior plan, deviation margin) measured by ``router train``.
    points: dict[int, tuple[priors.Point, ...]] = field(default_factory=dict)
    #: Per model, the call cap and stop-loss threshold ``router train`` learned (``router.features.task.attempt``).
    controls: dict[str, AttemptControl] = field(default_factory=dict)
    #: Per backend: provider tokens per o200k token, output mean and 90th percentile, cached share.
    estimates: Estimates = field(default_factory=Estimates)

    def expected_output(self, model: str, prompt_tokens: int) -> int | None:
        """The median output tokens of a call, learned from the log (None: no history)."""
        params = (self.meta.get("output_tokens") or {}).get(model)
        if not params:
            return None
        # log1p(output) = a + b·log1p(prompt), the median fitted by router.learning.training.outputs.
        a, b = params["q50"]
        return max(1, round(math.expm1(a + b * math.log1p(prompt_tokens))))

    @classmethod
    def from_bytes(cls, raw: bytes, *, source: str, expected_sha256: str | None) -> Artifact:
        digest = hashlib.sha256(raw).hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise ConfigError(
                f"{source}: sha256 mismatch: the policy pins {expected_sha256[:12]}…, the file is "
                f"{digest[:12]}… (promote the new artifact with `router promote`)"
            )
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not JSON: {exc}") from None
        if isinstance(obj, dict) and str(obj.get("format", "")).startswith("router-learned/"):
            if obj["format"] != FORMAT:
                raise ConfigError(
                    f"{source}: artifact format {obj['format']!r}, this router reads {FORMAT!r} "
                    "(a prior plan from the training log and per-task deviation margins); retrain with `router train`"
                )
        else:
            raise ConfigError(f"{source}: not a learned-policy artifact (format {FORMAT!r} expected)")
        if obj.get("feature_schema") != schema():
            raise ConfigError(
                f"{source}: feature schema mismatch: artifact has {obj.get('feature_schema')!r}, this "
                f"router computes {schema()!r}; retrain with `router train`"
            )
        width = len(NUMERIC) + HASH_DIM
        models = {}
        for mid, m in (obj.get("models") or {}).items():
            weights = tuple(float(x) for x in m["weights"])
            if len(weights) != width:
                raise ConfigError(
                    f"{source}: models.{mid}.weights: expected {width} values, got {len(weights)}"
                )
            models[mid] = ModelParams(
                weights=weights,
                platt=(float(m["platt"][0]), float(m["platt"][1])),
                cost_weights=tuple(float(x) for x in m["cost_weights"]),
                calls_per_attempt=float(m.get("calls_per_attempt", 1.0)),
                n=int(m.get("n", 0)),
            )
        meta = {k: v for k, v in obj.items() if k not in ("models", "feature_schema", "format")}
        task_sd = obj.get("task_effect_sd", 0.0)
        if not isinstance(task_sd, int | float) or not 0 <= task_sd <= 10:
            raise ConfigError(f"{source}: task_effect_sd: expected a number in [0, 10], got {task_sd!r}")
        curves = _value_curves(obj.get("value_curve"), source)
        scopes = _scope_effects(obj.get("scopes"), source)
        frontiers = priors.frontier_from_json(obj.get("prior_plans"), source)
        points = priors.points_from_json(obj.get("operating_points"), source)
        controls = _attempt_controls(obj.get("attempt_control"), source)
        estimates = Estimates.from_json(obj.get("estimates"), source)
        return cls(digest, models, obj["feature_schema"], meta, float(task_sd), curves, scopes=scopes,
                   frontiers=frontiers, points=points, controls=controls, estimates=estimates)  # fmt: skip

    @functools.cached_property
    def arrays(self) -> _Arrays:
        """Every model's parameters stacked, so scoring all candidates is one product."""
        k = len(NUMERIC)
        names = tuple(self.models)
        cost = np.zeros((len(names), k))
        for i, m in enumerate(self.models.values()):
            cost[i, : min(k, len(m.cost_weights))] = m.cost_weights[:k]
        return _Arrays(
            names=names,
            weights=np.array([m.weights for m in self.models.values()]).reshape(len(names), -1),
            platt=np.array([m.platt for m in self.models.values()]).reshape(len(names), 2),
            cost_weights=cost,
        )

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None) -> Artifact:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read learned artifact: {exc.strerror}") from None
        return cls.from_bytes(raw, source=str(path), expected_sha256=expected_sha256)


@dataclass(frozen=True)
class _Arrays:
    names: tuple[str, ...]
    weights: np.ndarray
    platt: np.ndarray
    cost_weights: np.ndarray

    def score(
        self, vec: Mapping[int, float], offsets: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(P(success), attempt cost) of every model, as ``ModelParams`` computes them one by one;
        ``offsets``: a scope's shift of each model's calibrated logit."""
        idx, vals = arrays(vec)
        z = self.weights[:, idx] @ vals if len(idx) else np.zeros(len(self.names))
        t = self.platt[:, 0] * z + self.platt[:, 1]
        if offsets is not None:
            t = t + offsets
        e = np.exp(-np.abs(t))  # the stable sigmoid, as _sigmoid
        p = np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        dense = idx < self.cost_weights.shape[1]
        cost = np.exp(self.cost_weights[:, idx[dense]] @ vals[dense])
        return p, cost


@dataclass(frozen=True, slots=True)
class ScopeEffects:
    """A scope's shift of the success logit: ``common`` for every model plus each model's own."""

    #: The scope's ``match`` it was trained under (a scope matching other tasks now is not given it).
    match: dict[str, str]
    common: float
    models: dict[str, float]

    def of(self, model: str) -> float:
        return self.common + self.models.get(model, 0.0)


def _scope_effects(raw: Any, source: str) -> dict[str, ScopeEffects]:
    if raw is None:
        return {}
    try:
        return {
            str(name): ScopeEffects(
                {str(k): str(v) for k, v in e["match"].items()},
                float(e["common"]),
                {str(m): float(v) for m, v in e["models"].items()},
            )
            for name, e in raw.items()
        }
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{source}: scopes: expected {{name: {{match: {{...}}, common: number, models: {{model: number}}}}}}"
        ) from None


def _attempt_controls(raw: Any, source: str) -> dict[str, AttemptControl]:
    if raw is None:
        return {}
    try:
        out = {}
        for model, c in raw.items():
            cap, below = c.get("max_calls"), c.get("stop_below")
            if cap is not None and (int(cap) != cap or cap < 1):
                raise ValueError(cap)
            if below is not None and not 0 < float(below) < 1:
                raise ValueError(below)
            out[str(model)] = AttemptControl(
                max_calls=None if cap is None else int(cap),
                stop_below=None if below is None else float(below),
            )
        return out
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{source}: attempt_control: expected {{model: {{max_calls: whole number ≥ 1 or null, "
            "stop_below: a probability in (0, 1) or null}}}}"
        ) from None


def _value_curves(raw: Any, source: str) -> dict[int, tuple[tuple[float, float], ...]]:
    if raw is None:
        return {}
    try:
        curves = {
            int(k): tuple(sorted((float(v), float(s)) for v, s, *_ in points)) for k, points in raw.items()
        }
    except (AttributeError, TypeError, ValueError):
        raise ConfigError(
            f"{source}: value_curve: expected {{max_attempts: [[value, success, cost], ...]}}"
        ) from None
    return curves


class LearnedScorer:
    """Orders candidates by the plan worth most under the objective (the first model of that plan
    first). A request that arrives when stopping was recommended is served by the best plan anyway:
    the client decided to try again."""

    def __init__(
        self, artifact: Artifact, objective: Objective, memory: int = PLAN_MEMORY,
        scope: ScopeEffects | None = None,
    ) -> None:  # fmt: skip
        self.artifact = artifact
        self.objective = objective
        self.name = f"learned:{artifact.sha256[:12]}"
        #: The scope's effects this scorer applies (one scorer per scope: ``router.policy.scopes``).
        self.scope = scope
        self._offsets = np.array([scope.of(m) for m in artifact.arrays.names]) if scope is not None else None
        self._memory = memory
        # Keyed by the vector's identity (the task state holds one vector per task); each entry
        # keeps its vector alive, so an id is never reused while its entry is remembered.
        self._plans: OrderedDict[Hashable, tuple[Mapping[int, float], Choice]] = OrderedDict()

    def expected_output(self, model: str, prompt_tokens: int) -> int | None:
        return self.artifact.expected_output(model, prompt_tokens)

    @property
    def estimates(self) -> Estimates:
        return self.artifact.estimates

    def options(
        self,
        vec: Mapping[int, float],
        models: Sequence[str],
        per_call_cost: Mapping[str, float] | None = None,
    ) -> list[Option]:
        known = {m: p for m, p in self.artifact.models.items() if m in models}
        arrays = self.artifact.arrays
        p, cost = arrays.score(vec, self._offsets)
        out = [Option(m, float(p[i]), float(cost[i])) for i, m in enumerate(arrays.names) if m in known]
        if len(out) < len(models):
            # A model the log has not seen: an even chance, at its call estimate times a typical
            # loop, or at the median attempt cost of the models that were seen.
            costs = sorted(o.attempt_cost for o in out)
            median = costs[len(costs) // 2] if costs else 0.0
            for m in models:
                if m not in known:
                    call = (per_call_cost or {}).get(m)
                    out.append(Option(m, 0.5, call * TYPICAL_CALLS if call else median))
        return out

    def plan(
        self, vec: Mapping[int, float], models: Sequence[str], *, attempt: int = 1,
        failed: Sequence[str] = (), per_call_cost: Mapping[str, float] | None = None,
        budget: float | None = None,
    ) -> tuple[Plan, tuple[Option, ...]]:  # fmt: skip
        """The plan to serve for this task and attempt, and the options it was chosen from."""
        chosen = self.choose(
            vec, models, attempt=attempt, failed=failed, per_call_cost=per_call_cost, budget=budget
        )
        return chosen.plan, chosen.options

    def choose(
        self, vec: Mapping[int, float], models: Sequence[str], *, attempt: int = 1,
        failed: Sequence[str] = (), per_call_cost: Mapping[str, float] | None = None,
        budget: float | None = None,
    ) -> Choice:  # fmt: skip
        """The plan for this task and attempt: what is left of the prior plan, or the task's own.

        Every call of an attempt asks the same question (the task's vector, the same candidates),
        so answers are remembered (LRU): the plan search is then paid once per attempt, not per
        agent call. Only what the answer depends on is in the key: a per-call cost matters only for
        models the artifact does not know. The vector must not be changed once passed here (the
        router computes a task's vector once and never changes it).
        """
        unknown = tuple(
            sorted((m, c) for m, c in (per_call_cost or {}).items() if m not in self.artifact.models)
        )
        key = (id(vec), tuple(models), attempt, tuple(failed), unknown, budget)
        found = self._plans.get(key)
        if found is not None and found[0] is vec:
            self._plans.move_to_end(key)
            return found[1]
        chosen = self._search(vec, models, attempt, failed, per_call_cost, budget)
        self._plans[key] = (vec, chosen)
        if len(self._plans) > self._memory:
            self._plans.popitem(last=False)
        return chosen

    def _search(
        self, vec: Mapping[int, float], models: Sequence[str], attempt: int, failed: Sequence[str],
        per_call_cost: Mapping[str, float] | None, budget: float | None,
    ) -> Choice:  # fmt: skip
        opts = tuple(self.options(with_attempt(vec, attempt), models, per_call_cost))
        obj = self.objective
        left = max(1, obj.max_attempts - attempt + 1)
        limit = budget if budget is not None else obj.max_cost_per_task
        sd = self.artifact.task_sd
        best = best_plan(
            opts, attempts_left=left, already_failed=failed, value=obj.value, budget=limit, task_sd=sd
        )
        own = Choice(best, opts, best.worth_trying(obj.value), prior=False)
        if obj.prior is None or obj.value is None:
            return own
        by_model = {o.model: o for o in opts}
        rest_models = priors.remainder(obj.prior, failed, models, left)
        failed_opts = [by_model[m] for m in failed if m in by_model]
        rest = evaluate([by_model[m] for m in rest_models], failed_opts, sd) if rest_models else None
        if rest is not None and limit is not None and rest.expected_cost > limit:
            return own  # what is left of the prior plan does not fit the budget: the task's own plan
        if priors.deviates(best, rest, obj.value, obj.margin):
            return own
        # The prior plan says stop: a client that retries anyway is served the task's own best,
        # which is not the prior plan (nothing of it is left), so the reason must not say so.
        return (
            Choice(rest, opts, True, prior=True)
            if rest is not None
            else Choice(best, opts, False, prior=False)
        )

    def recommend(
        self, vec: Mapping[int, float], models: Sequence[str], *, attempt: int, failed: Sequence[str],
        budget: float | None = None,
    ) -> Next:  # fmt: skip
        """After ``attempt - 1`` attempts failed on ``failed``: is attempt ``attempt`` worth making?"""
        if attempt > self.objective.max_attempts:
            return Next(False, None, 0.0, 0.0)
        chosen = self.choose(vec, models, attempt=attempt, failed=failed, budget=budget)
        if not chosen.go:
            return Next(False, None, 0.0, 0.0)
        plan = chosen.plan
        return Next(True, plan.models[0], plan.success, plan.expected_cost)

    def rank(self, features: Features, estimates: list[Any]) -> tuple[list[Any], float, str]:
        from router.policy.decide import CheapestScorer

        vec = features.task_vector
        if vec is None:  # side calls never get here: the Decider ranks them by cost alone
            return CheapestScorer().rank(features, estimates)
        chosen = self.choose(
            vec, [e.model for e in estimates], attempt=features.attempt, failed=features.failed_models,
            per_call_cost={e.model: e.cost_usd for e in estimates}, budget=features.task_budget_left,
        )  # fmt: skip
        plan, opts = chosen.plan, chosen.options
        by_model = {o.model: o for o in opts}
        for e in estimates:
            o = by_model[e.model]
            e.p_success = round(o.p_success, 4)
            e.attempt_cost_usd = round(o.attempt_cost, 6)
            e.cost_per_completed_usd = round(o.attempt_cost / max(o.p_success, 1e-6), 6)
            e.score = e.cost_per_completed_usd
        first = plan.models[0]
        ranked = sorted(estimates, key=lambda e: (e.model != first, e.score))
        reason = (
            f"{'prior plan' if chosen.prior else 'plan'} {' → '.join(plan.models)}: expected ${plan.cost_per_completed:.4f} per completed task, "
            f"success {plan.success:.0%}"
        )
        return ranked, 1.0, reason


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)
