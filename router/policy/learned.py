"""The learned policy: the scorer that plans with a trained artifact (``router.policy.artifact``:
the data, not code), under its objective (``router.policy.objective``, re-exported here).

The scorer follows what is left of the prior plan (the best fixed order on the training log for
the objective) unless the task's own plan clears the margin ``router train`` measured for it.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from router.features.request import Features
from router.features.task.vector import with_attempt
from router.policy import prior as priors
from router.policy.artifact import Artifact, ScopeEffects
from router.policy.estimates import Estimates
from router.policy.objective import Choice, Next, Objective
from router.policy.plan import Option, Plan, best_plan, evaluate

__all__ = ["Choice", "LearnedScorer", "Next", "Objective"]

#: Calls in an agent attempt, assumed for a model the log has not seen yet.
TYPICAL_CALLS = 20
#: Plans remembered per scorer (one per task attempt in flight is enough; entries are small).
PLAN_MEMORY = 4096


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
        sd, noise = self.artifact.task_sd, self.artifact.noise
        # Planned under the verifier the log's outcomes came through (its known error rates).
        best = best_plan(
            opts, attempts_left=left, already_failed=failed, value=obj.value, budget=limit, task_sd=sd,
            noise=noise,
        )  # fmt: skip
        own = Choice(best, opts, best.worth_trying(obj.value), prior=False)
        if obj.prior is None or obj.value is None:
            return own
        by_model = {o.model: o for o in opts}
        rest_models = priors.remainder(obj.prior, failed, models, left)
        failed_opts = [by_model[m] for m in failed if m in by_model]
        rest = evaluate([by_model[m] for m in rest_models], failed_opts, sd, noise) if rest_models else None
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
            e.p_success, e.attempt_cost_usd, e.cost_per_completed_usd = _logged(o.p_success, o.attempt_cost)
            e.score = e.cost_per_completed_usd
        first = plan.models[0]
        ranked = sorted(estimates, key=lambda e: (e.model != first, e.score))
        reason = (
            f"{'prior plan' if chosen.prior else 'plan'} {' → '.join(plan.models)}: expected ${plan.cost_per_completed:.4f} per completed task, "
            f"success {plan.success:.0%}"
        )
        return ranked, 1.0, reason


@functools.lru_cache(maxsize=4096)
def _logged(p_success: float, attempt_cost: float) -> tuple[float, float, float]:
    """An option's P(success), attempt cost and cost per completed attempt as logged and ranked.

    Remembered: the plan is searched once per attempt, but every call of the attempt ranks its
    options again, and ``round`` to n digits goes through a decimal string (~0.3 µs a call)."""
    return round(p_success, 4), round(attempt_cost, 6), round(attempt_cost / max(p_success, 1e-6), 6)
