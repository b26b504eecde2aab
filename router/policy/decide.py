"""The decision: features + catalog → an ordered list of backends, with reasons. Pure, no I/O.

The pipeline is fixed and the last step is pluggable:

1. the route maps the requested model to candidates (or one pass-through backend);
2. rules from the policy file filter (``only``/``exclude``) and promote (``prefer``) candidates;
3. hard constraints exclude what cannot work: context window, tools, vision;
4. a ``Scorer`` orders the survivors. ``CheapestScorer`` ranks by expected cost of the call;
   the learned policy is another ``Scorer`` and needs nothing else changed.

Every candidate keeps its estimates and, when excluded, the reason, for ``/v1/route`` and the log.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from router.catalog import Backend, Catalog
from router.errors import BadRequest, ContextTooLarge, UnknownModel
from router.features import Features
from router.policy.config import Policy


@dataclass(slots=True)
class Estimate:
    model: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
    excluded: str | None = None
    score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None}


@dataclass(slots=True)
class Decision:
    decision_id: str
    policy: str
    #: Backends to try, best first; the rest are fallbacks.
    order: list[str]
    candidates: list[Estimate]
    reason: str
    #: Probability with which ``order[0]`` was picked (1.0 for deterministic choices).
    propensity: float = 1.0
    rules_applied: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> str:
        return self.order[0]

    def estimate(self, model: str) -> Estimate | None:
        return next((e for e in self.candidates if e.model == model), None)


class Scorer(Protocol):
    name: str

    def rank(self, features: Features, estimates: list[Estimate]) -> tuple[list[Estimate], float, str]:
        """Order the eligible estimates best first; return them, the propensity and a reason."""
        ...


class CheapestScorer:
    name = "cheapest"

    def rank(self, features: Features, estimates: list[Estimate]) -> tuple[list[Estimate], float, str]:
        ranked = sorted(estimates, key=lambda e: e.cost_usd)
        for e in ranked:
            e.score = e.cost_usd
        return ranked, 1.0, "cheapest expected cost among the candidates that fit"


def estimate(backend: Backend, features: Features, expected_output: int) -> Estimate:
    out = min(features.max_output_tokens or expected_output, expected_output, backend.max_output_tokens)
    cost = backend.price.cost(features.prompt_tokens, out)
    return Estimate(backend.id, features.prompt_tokens, out, 0, cost)


class Decider:
    def __init__(self, policy: Policy, catalog: Catalog, scorer: Scorer | None = None) -> None:
        self.policy = policy
        self.catalog = catalog
        self.scorer = scorer or CheapestScorer()

    def decide(self, features: Features) -> Decision:
        route = self.policy.route_for(features.requested_model)
        if route is None:
            raise UnknownModel(
                f"model {features.requested_model!r} is not served here; see GET /v1/models for the names"
            )
        names = [route.passthrough] if route.passthrough else list(route.candidates)
        applied: list[str] = []
        excluded: dict[str, str] = {}
        preferred: list[str] = []
        facts = features.for_rules()
        for rule in self.policy.rules:
            if not rule.condition.matches(facts):
                continue
            applied.append(rule.name)
            for n in names:
                if n in excluded:
                    continue
                if (rule.only is not None and n not in rule.only) or n in rule.exclude:
                    excluded[n] = f"rule {rule.name}"
            preferred.extend(p for p in rule.prefer if p not in preferred)

        defaults = self.policy.defaults
        estimates = []
        for n in names:
            backend = self.catalog[n]
            e = estimate(backend, features, defaults.expected_output_tokens)
            e.excluded = excluded.get(n) or self._hard_constraint(
                backend, features, defaults.reserve_output_tokens
            )
            estimates.append(e)
        eligible = [e for e in estimates if e.excluded is None]
        if not eligible:
            raise self._nothing_fits(features, estimates)
        ranked, propensity, reason = self.scorer.rank(features, eligible)
        order = [e.model for e in ranked]
        front = [p for p in preferred if p in order]
        if front:
            order = front + [m for m in order if m not in front]
            reason = f"preferred by rule; then {reason}"
            propensity = 1.0
        for fb in route.fallbacks:
            backend = self.catalog[fb]
            if fb not in order and fb not in excluded and not self._hard_constraint(backend, features, 0):
                order.append(fb)
        return Decision(
            decision_id=uuid.uuid4().hex,
            policy=f"{self.policy.name}/{self.scorer.name}",
            order=order,
            candidates=estimates,
            reason=reason,
            propensity=propensity,
            rules_applied=applied,
        )

    @staticmethod
    def _hard_constraint(backend: Backend, features: Features, reserve: int) -> str | None:
        wanted_out = min(features.max_output_tokens or reserve, backend.max_output_tokens)
        if features.prompt_tokens + wanted_out > backend.context_window:
            return (
                f"context: ~{features.prompt_tokens} prompt + {wanted_out} output tokens "
                f"> window {backend.context_window}"
            )
        if features.tools and not backend.tools:
            return "capability: no tool use"
        if features.vision and not backend.vision:
            return "capability: no image input"
        return None

    @staticmethod
    def _nothing_fits(features: Features, estimates: list[Estimate]) -> Exception:
        reasons = "; ".join(f"{e.model}: {e.excluded}" for e in estimates)
        if all(e.excluded and e.excluded.startswith("context") for e in estimates):
            return ContextTooLarge(
                f"no backend can hold this prompt (~{features.prompt_tokens} tokens): {reasons}"
            )
        return BadRequest(f"no backend can serve this request: {reasons}")
