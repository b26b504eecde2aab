"""The decision: features + catalog → an ordered list of backends, with reasons. Pure, no I/O.

The pipeline is fixed and the last step is pluggable:

1. the route maps the requested model to candidates (or one pass-through backend);
2. rules from the policy file filter (``only``/``exclude``) and promote (``prefer``) candidates;
3. hard constraints exclude what cannot work: context window (``router.policy.window``), tools,
   vision; then what is left of the task's and the key's budgets excludes the candidates whose
   estimate exceeds it, while any candidate fits (when none does, the cheapest is tried and
   admission refuses it);
4. a ``Scorer`` orders the survivors. ``CheapestScorer`` ranks by expected cost of the call;
   the learned policy is another ``Scorer`` and needs nothing else changed;
5. the route's fallbacks follow, estimated like candidates (a budget holds for the dearest
   backend a request may reach) and left out when the budget left cannot hold them.

Every candidate keeps its estimates and, when excluded, the reason, for ``/v1/route`` and the log.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.errors import BadRequest, ContextTooLarge, UnknownModel
from router.features.request import Features
from router.ids import IdMaker
from router.policy.budget import budget_left, exclude_over_budget, held
from router.policy.catalog import Backend, Catalog
from router.policy.config import Policy
from router.policy.estimates import Estimates, turn_cell
from router.policy.pricing import PRIORS, estimate, with_hosted_tools
from router.policy.window import over_window, wanted_output
from router.store.records import Estimate


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
    #: ``order[0]`` is exploration's random pick, not the policy's choice (``reason`` names that).
    explored: bool = False
    #: The per-task budget of the policy that decided (a scope's, when one did), for admission.
    task_budget: float | None = None
    #: The estimates of the route's fallbacks in ``order``: not candidates (neither ranked nor
    #: logged as actions), but a budget holds for them as for any backend the request may reach.
    fallbacks: list[Estimate] = field(default_factory=list)

    @property
    def chosen(self) -> str:
        return self.order[0]

    def estimate(self, model: str) -> Estimate | None:
        return next((e for e in (*self.candidates, *self.fallbacks) if e.model == model), None)


#: How an explored decision's reason starts, in the log and on the console (whose cut at 60
#: characters keeps the policy's own choice after it).
EXPLORED = "explored ("


def was_explored(reason: str | None) -> bool:
    """Whether a logged decision was exploration's random pick (its reason says so)."""
    return reason is not None and reason.startswith(EXPLORED)


class Scorer(Protocol):
    name: str

    def rank(self, features: Features, estimates: list[Estimate]) -> tuple[list[Estimate], float, str]:
        """Order the eligible estimates best first; return them, the propensity and a reason."""
        ...


class CheapestScorer:
    """The cheapest expected cost first: the policy's order with no learned routing. ``estimates``:
    the sizes of a call an artifact learned without routing (``router train`` on a log with too
    few labelled attempts), which price the candidates; ``name`` then says which artifact."""

    def __init__(self, estimates: Estimates | None = None, name: str = "cheapest") -> None:
        self.estimates = estimates
        self.name = name

    def rank(self, features: Features, estimates: list[Estimate]) -> tuple[list[Estimate], float, str]:
        ranked = sorted(estimates, key=lambda e: e.cost_usd)
        for e in ranked:
            e.score = e.cost_usd
        return ranked, 1.0, "cheapest expected cost among the candidates that fit"


_CHEAPEST = CheapestScorer()


class Decider:
    def __init__(
        self, policy: Policy, catalog: Catalog, scorer: Scorer | None = None, rng: random.Random | None = None,
        estimates: Estimates | None = None, *, bound: Policy | None = None,
    ) -> None:  # fmt: skip
        """``bound``: for a scope's decider, the policy it overlays; the scope decides only among
        the backends that policy's own route and rules would allow the request (it narrows,
        never widens: a scope can be chosen by what the client sends)."""
        self.policy = policy
        self.bound = bound
        self.catalog = catalog
        self.scorer = scorer or CheapestScorer()
        #: Per-backend provider tokens, output and cache share: given, the learned artifact's, or priors.
        self.estimates: Estimates = estimates or getattr(self.scorer, "estimates", None) or PRIORS
        self.epsilon = policy.objective.exploration.epsilon
        self._rng = rng or random.Random(policy.objective.exploration.seed)
        self._new_id = IdMaker()
        # The rules a prompt's size can switch on or off: size_matters looks at no other.
        self._sized_rules = tuple(r for r in policy.rules if "prompt_tokens" in r.condition.fields())
        #: The request headers the rules read (logged with the request, for previews).
        self.rule_headers = tuple(sorted({f[8:] for r in policy.rules for f in r.condition.fields()
                                          if f.startswith("headers.")}))  # fmt: skip

    def decide(self, features: Features, *, explore: bool = True) -> Decision:
        """``explore``: False for a look at the decision (``/v1/route``) — a preview shows the
        policy's choice, and must not draw from the exploration's seeded sequence either."""
        route = self.policy.route_for(features.requested_model)
        if route is None:
            name = features.requested_model
            if name in self.catalog.backends:
                # GET /v1/models lists the backends too: "see GET /v1/models" sent the reader in a circle.
                raise UnknownModel(
                    f"model {name!r} is a backend of this policy, but no route serves that name: ask for "
                    f"a route's name, or add `- {{match: {name}, passthrough: {name}}}` to the policy's routes"
                )
            # The names themselves: an agent configured with a provider's model name (gpt-4o) learns
            # what to ask for without a second request.
            asked = ", ".join(r.match for r in self.policy.routes)
            raise UnknownModel(f"model {name!r} is not served here; ask for one of: {asked} (GET /v1/models)")
        names = route.chosen_among
        facts = features.for_rules()
        applied, excluded, preferring = self._rules(names, facts)
        allowed = _allowed(self.bound, features.requested_model, facts) if self.bound is not None else None
        if allowed is not None:
            for n in names:
                if n not in allowed and n not in excluded:
                    excluded[n] = f"scope: not a backend the policy allows for {features.requested_model!r}"

        estimates = []
        cell = turn_cell(features.turn_chars, features.turn_verb)
        for n in names:
            backend = self.catalog[n]
            e = self._estimate(backend, features, cell)
            e.excluded = excluded.get(n) or self._hard_constraint(
                backend, features, self.reserve(backend), e.prompt_tokens
            )
            estimates.append(e)
        self._switch_rules(features, estimates)
        eligible = [e for e in estimates if e.excluded is None]
        if not eligible:
            raise self._nothing_fits(features, estimates)
        broke = not exclude_over_budget(features, eligible)
        # The one place side calls (titles, summaries) are sent to the cheapest model that fits.
        scorer = _CHEAPEST if features.side_call or broke else self.scorer
        # The eligible but those exclude_over_budget has just taken out.
        ranked, propensity, reason = scorer.rank(features, [e for e in eligible if e.excluded is None])
        order = [e.model for e in ranked]
        failed = [m for m in order if m in features.failed_models]
        if (
            failed
            and isinstance(scorer, CheapestScorer)
            and features.pinned is None
            and len(failed) < len(order)
        ):
            # A new attempt after failures (reported, or stopped by the router) escalates: the
            # models that failed the task go last (a learned plan knows what failed already).
            order = [m for m in order if m not in failed] + failed
            reason = f"{reason}; failed this task before: {', '.join(failed)}"
        explored = None
        once = not features.side_call and features.pinned is None  # an attempt's first model only
        if broke:
            # Admission refuses it: as the cheapest's refusal, a 429 while money held in flight may
            # return. The cheapest alone, so that the refusal quotes its cost, not the dearest's
            # that the whole order would hold (a client read $0.01869 where $0.000447 was asked).
            reason = f"no candidate fits the budget left (${budget_left(features):.6f}): the cheapest"
            order = order[:1]
        elif explore and self.epsilon > 0 and len(order) > 1 and once:
            order, propensity, explored = self._explore(order)
        pinned = features.pinned
        left_for = f"switch: {features.switch_reason}"
        if pinned in order and not features.side_call and not broke:
            # Within an attempt the task stays where it started: its context is warm there.
            order.remove(pinned)
            order.insert(0, pinned)
            reason, propensity = f"pinned to {pinned} for attempt {features.attempt}", 1.0
        elif pinned is not None and any(e.model == pinned and e.excluded == left_for for e in estimates):
            # Named: the console said only "cheapest ..." when a loop had just moved the task.
            reason = f"left {pinned} ({features.switch_reason}); then {reason}"
        front = [p for p in preferring if p in order and not broke]
        if front:
            order = front + [m for m in order if m not in front]
            # Named: "preferred by rule" left the reader to guess which (console, log, /ui).
            reason = (
                f"preferred by rule {', '.join(dict.fromkeys(preferring[m] for m in front))}; then {reason}"
            )
            propensity = 1.0
            explored = None  # a rule decided the front, whatever exploration drew
        if explored is not None:
            reason = f"{EXPLORED}epsilon {self.epsilon}); the policy chose {explored}: {reason}"
        if route.passthrough is not None:
            # One model named: nothing was ranked, explored, pinned or preferred, whatever the scorer says.
            reason, propensity = "passthrough route", 1.0
        fallbacks = self._fallbacks(route.fallbacks, order, excluded, allowed, features, cell)
        order += [e.model for e in fallbacks]
        return Decision(
            decision_id=self._new_id(),
            policy=f"{self.policy.name}/{self.scorer.name}",
            order=order,
            candidates=estimates,
            reason=reason,
            propensity=propensity,
            rules_applied=applied,
            explored=explored is not None,
            task_budget=self.policy.objective.max_cost_per_task,
            fallbacks=fallbacks,
        )

    def _rules(
        self, names: list[str], facts: dict[str, Any]
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """The policy's rules that match: their names, the candidates they exclude (each with the
        first rule that does), and the models they prefer, in order (each with the first rule that
        prefers it, the one the reason names)."""
        applied: list[str] = []
        excluded: dict[str, str] = {}
        preferring: dict[str, str] = {}
        for rule in self.policy.rules:
            if not rule.condition.matches(facts):
                continue
            applied.append(rule.name)
            for n in names:
                if n not in excluded and (
                    (rule.only is not None and n not in rule.only) or n in rule.exclude
                ):
                    excluded[n] = f"rule {rule.name}"
            for p in rule.prefer:
                preferring.setdefault(p, rule.name)
        return applied, excluded, preferring

    def _fallbacks(
        self, names: list[str], order: list[str], excluded: dict[str, str], allowed: set[str] | None,
        features: Features, cell: str | None,
    ) -> list[Estimate]:  # fmt: skip
        """The estimates of the route's fallbacks the request may reach after ``order``: not in it,
        not excluded by a rule or a scope's bound, fitting their window and the budget left."""
        fallbacks: list[Estimate] = []
        left = budget_left(features)
        reached = set(order)
        for fb in names:
            if fb in reached or fb in excluded or (allowed is not None and fb not in allowed):
                continue
            e = self._estimate(self.catalog[fb], features, cell)
            # A fallback the budget left cannot hold is dropped: held or not, it could spend past it.
            if not self._hard_constraint(self.catalog[fb], features, 0, e.prompt_tokens) and (
                left is None or held(e) <= left
            ):
                reached.add(fb)
                fallbacks.append(e)
        return fallbacks

    def _estimate(self, backend: Backend, features: Features, cell: str | None) -> Estimate:
        prompt = self.prompt_tokens(backend, features.prompt_tokens, features)
        mean, high = self.output(backend, features, cell)
        e = estimate(backend, features, mean, self.estimates, prompt, high)
        e.output_cell = cell
        defaults = self.policy.defaults
        return with_hosted_tools(e, backend, features, defaults.held_tool_calls, defaults.worst_tool_calls)

    def size_matters(self, features: Features, low: int, high: int) -> bool:
        """Whether a prompt of ``low`` and one of ``high`` tokens could be decided differently.

        Only the hard parts count: a rule whose condition reads the size, a context window. The
        ranking by cost also moves with the size, but smoothly: an estimate is what it is for.
        """
        if low == high:
            return False
        route = self.policy.route_for(features.requested_model)
        if route is None:
            return False  # decide refuses it whatever the size
        if self._sized_rules:
            facts = features.for_rules()
            small, large = {**facts, "prompt_tokens": low}, {**facts, "prompt_tokens": high}
            for rule in self._sized_rules:
                if rule.condition.matches(small) != rule.condition.matches(large):
                    return True
        names = route.chosen_among
        for names_, reserved in ((names, True), (route.fallbacks, False)):
            for n in names_:
                backend = self.catalog[n]
                reserve = self.reserve(backend) if reserved else 0
                least, most = (self.prompt_tokens(backend, x, features) for x in (low, high))
                cap = features.max_output_tokens
                if over_window(backend, cap, reserve, least) != over_window(backend, cap, reserve, most):
                    return True
        return False

    def prompt_tokens(self, backend: Backend, tokens: int, features: Features) -> int:
        """``tokens`` (an estimate of ``features``' prompt) in ``backend``'s provider tokens: the
        anchor's part as its provider counted it (converted if another provider is asked), the
        rest from o200k at the backend's ratio."""
        if features.prompt_anchor is None:
            return tokens
        est = self.estimates
        ratio = est.tokens_ratio(backend.id, backend.provider)
        anchor = min(features.prompt_anchor, tokens)
        source = features.anchor_model
        if anchor and source is not None and source != backend.id and source in self.catalog.backends:
            anchor = round(anchor * ratio / est.tokens_ratio(source, self.catalog[source].provider))
        return anchor + round((tokens - min(features.prompt_anchor, tokens)) * ratio)

    def output(self, backend: Backend, features: Features, cell: str | None = None) -> tuple[int, int | None]:
        """The expected output of a call on ``backend`` (its cost) and the high one a budget holds for.

        Learned per backend (the mean of the call's ``turn_cell``, else of its shape's, else of all its calls, and the
        90th percentile), else the scorer's fit (older artifacts), else the policy's default (and
        the hold is the expected cost)."""
        defaults = self.policy.defaults
        learned = self.estimates.of(backend.id)
        cell_mean = self.estimates.output_mean(backend.id, cell)
        mean: int | None = round(cell_mean) if cell_mean else None
        if mean is None:
            out_model: Callable[[str, int], int | None] | None = getattr(self.scorer, "expected_output", None)
            mean = out_model(backend.id, features.prompt_tokens) if out_model else None
        high = max(1, round(learned.output_p90)) if learned.output_p90 else None
        return max(1, mean or defaults.expected_output_tokens), high

    def reserve(self, backend: Backend) -> int:
        """The output a context window must leave room for when the client set no limit: the
        policy's ``reserve_output_tokens``, or the backend's learned 90th percentile where larger.
        Never less: a server that gives a call with no limit one of its own (DeepSeek's 4,096)
        refuses a prompt that leaves less room, however short the replies the log saw (8 tokens
        a call on the demo's)."""
        p90 = self.estimates.of(backend.id).output_p90 or 0
        return max(self.policy.defaults.reserve_output_tokens, round(p90))

    def _explore(self, order: list[str]) -> tuple[list[str], float, str | None]:
        """Epsilon-greedy over the eligible candidates, at the start of an attempt only: the
        order, the propensity, and the policy's own choice when the random pick replaced it.

        The logged propensity is what off-policy evaluation divides by: the probability that
        this policy would pick the model it picked.
        """
        k, eps, best = len(order), self.epsilon, order[0]
        if self._rng.random() < eps:
            order = list(order)
            order.insert(0, order.pop(self._rng.randrange(k)))
        if order[0] == best:  # a random draw of the policy's own choice: nothing was explored
            return order, (1 - eps) + eps / k, None
        return order, eps / k, best

    def _switch_rules(self, features: Features, estimates: list[Estimate]) -> None:
        """Leave the pinned model only when told to, and only for backends that accept the history."""
        pinned = features.pinned
        if pinned is None or features.side_call:
            return
        if features.switch_reason:
            others = [e for e in estimates if e.excluded is None and e.model != pinned]
            legal = [e for e in others if self._accepts_history(features, e.model)]
            if legal:
                for e in estimates:
                    if e.model == pinned:
                        e.excluded = f"switch: {features.switch_reason}"  # read by the reason
                # On, not back: a loop on the second model sent the task back to the first,
                # the one that had looped, while a third was there.
                if any(e.model not in features.left_models for e in legal):
                    for e in legal:
                        if e.model in features.left_models:
                            e.excluded = "switch: left earlier in this attempt"
        for e in estimates:
            if e.excluded is None and e.model != pinned and not self._accepts_history(features, e.model):
                e.excluded = f"switch: history holds {features.signed_history} state signed by {pinned}"

    def _accepts_history(self, features: Features, model: str) -> bool:
        # Another backend of the same protocol would receive (and reject) the pinned backend's
        # signed blocks; a backend of another protocol gets them dropped in translation.
        if features.signed_history is None or features.pinned is None:
            return True
        return model == features.pinned or self.catalog[model].protocol != features.signed_history

    @staticmethod
    def _hard_constraint(backend: Backend, features: Features, reserve: int, prompt: int) -> str | None:
        if over_window(backend, features.max_output_tokens, reserve, prompt):
            wanted_out = wanted_output(backend, features.max_output_tokens, reserve)
            # Where the model stops at its window, the output is the least room a reply needs.
            room = " room for" if backend.stops_at_window else ""
            return f"context: ~{prompt} prompt +{room} {wanted_out} output tokens > window {backend.context_window}"
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


def _allowed(policy: Policy, requested: str, facts: dict[str, Any]) -> set[str]:
    """The backends ``policy`` itself would consider for this request: its route's candidates
    that its matching rules leave, and the route's fallbacks."""
    route = policy.route_for(requested)
    if route is None:
        return set()
    names = route.chosen_among
    for rule in policy.rules:
        if rule.condition.matches(facts):
            names = [n for n in names if (rule.only is None or n in rule.only) and n not in rule.exclude]
    return {*names, *route.fallbacks}
