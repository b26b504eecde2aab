"""Scopes: per-repository, per-key and per-team overrides of routes, rules and objective.

Each scope is the main policy with its ``routes``, ``rules`` or ``objective`` laid over the
policy's own (``overlay``: by route match, by rule name, by objective field), decided
by a decider of its own (the same catalog and learned model, shifted by the scope's own effects
when ``router train`` kept some: ``router.learning.training.scopes``). The first scope whose ``match``
holds decides a request; the control arm, when there is one, comes before any scope (the
reference stays one policy for every task). A scope's name is in the log's ``policy`` column
(``<policy>/<scope>/<scorer>``).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.errors import ConfigError
from router.features.task.vector import repo_hint
from router.policy.catalog import Catalog
from router.policy.config import ObjectiveSpec, Policy, PolicyFile, Scope, ScopeMatch
from router.policy.decide import Decider
from router.policy.learned import LearnedScorer
from router.protocols.common import ClientRequest
from router.store import RequestRecord

log = logging.getLogger("router.policy")

REPO_HEADER = "x-router-repo"
TEAM_HEADER = "x-router-team"


@dataclass(frozen=True, slots=True)
class ScopeFacts:
    repo: str | None = None
    key: str | None = None
    team: str | None = None


def scope_facts(req: ClientRequest, headers: Mapping[str, str], key_id: str | None) -> ScopeFacts:
    """What scopes match on: the repository as the log keeps it (its header, else a github.com URL
    in the first user message, else a git remote in the system prompt)."""
    repo = repo_hint(req.first_user_text, headers.get(REPO_HEADER), req.system_text)
    return ScopeFacts(repo=repo, key=key_id, team=headers.get(TEAM_HEADER))


def logged_facts(row: RequestRecord, task_repo: str | None = None) -> ScopeFacts:
    """The facts of a logged request: the headers its record kept, else the task's repository as
    the log keeps it (``task_repo``: the ``repo`` column of the task's first request)."""
    headers = row.rule_headers or {}
    return ScopeFacts(headers.get(REPO_HEADER) or task_repo, row.key_id, headers.get(TEAM_HEADER))


def _holds(pattern: str | None, value: str | None) -> bool:
    return pattern is None or (value is not None and fnmatch.fnmatchcase(value, pattern))


def holds(match: ScopeMatch, facts: ScopeFacts) -> bool:
    """Whether every glob of ``match`` holds for ``facts``."""
    return _holds(match.repo, facts.repo) and _holds(match.key, facts.key) and _holds(match.team, facts.team)


def first_scope(scopes: Sequence[Scope], facts: ScopeFacts) -> Scope | None:
    """The scope that decides a request with these facts (the first whose match holds)."""
    return next((s for s in scopes if holds(s.match, facts)), None)


@dataclass(frozen=True)
class ScopedDecider:
    name: str
    match: ScopeMatch
    decider: Decider

    def matches(self, facts: ScopeFacts) -> bool:
        return holds(self.match, facts)


def with_effects(scorer: object, scope: Scope) -> object:
    """The scope's scorer with the scope's learned effects, when the artifact kept some for it
    under the same ``match`` (one trained for other tasks would shift the wrong ones)."""
    if not isinstance(scorer, LearnedScorer):
        return scorer
    effects = scorer.artifact.scopes.get(scope.name)
    if effects is None:
        return scorer
    if effects.match != scope.match.model_dump(exclude_none=True):
        log.warning(
            "scope %s: the learned artifact's effects were trained for match %s, the scope now matches %s: "
            "not applied (retrain with `router train`)", scope.name, effects.match,
            scope.match.model_dump(exclude_none=True),
        )  # fmt: skip
        return scorer
    return LearnedScorer(scorer.artifact, scorer.objective, scope=effects)


def overlay(spec: PolicyFile, scope: Scope) -> dict[str, object]:
    """The sections a scope changes, laid over the policy's own: a scope route replaces the route
    with the same ``match`` and comes first (so every other requested model is still served), a
    scope rule replaces the rule of the same name and comes first, and the objective's fields the
    scope sets replace those fields (giving a value or a target replaces the other), except a
    per-task budget, which is the lower of the two. What a scope routes to is further bound by the
    policy's own routes and rules (``Decider``'s ``bound``)."""
    out: dict[str, object] = {}
    if scope.routes is not None:
        mine = {r.match for r in scope.routes}
        out["routes"] = [*scope.routes, *(r for r in spec.routes if r.match not in mine)]
    if scope.rules is not None:
        mine = {r.name for r in scope.rules}
        out["rules"] = [*scope.rules, *(r for r in spec.rules if r.name not in mine)]
    if scope.objective is not None:
        given = scope.objective.model_dump(exclude_unset=True)
        if given.keys() & {"value_per_completed_usd", "target_success", "min_success"}:
            given = {"value_per_completed_usd": None, "target_success": None, "min_success": None, **given}
        budget, main = scope.objective.max_cost_per_task, spec.objective.max_cost_per_task
        if budget is not None and main is not None:
            given["max_cost_per_task"] = min(budget, main)  # a scope narrows a budget, never widens it
        out["objective"] = ObjectiveSpec.model_validate({**spec.objective.model_dump(), **given})
    return out


def build_scopes(
    policy: Policy, catalog: Catalog, scorer_for: Callable[[Policy], object]
) -> tuple[ScopedDecider, ...]:
    out = []
    seen: set[str] = set()
    for i, scope in enumerate(policy.spec.scopes):
        if scope.name in seen:
            raise ConfigError(f"{policy.source}: scopes[{i}].name: duplicate scope name {scope.name!r}")
        seen.add(scope.name)
        update: dict[str, object] = {"name": f"{policy.name}/{scope.name}", "scopes": [], "control": None,
                                     "guard": None, **overlay(policy.spec, scope)}  # fmt: skip
        scoped = Policy(
            policy.spec.model_copy(update=update),
            f"{policy.source}: scopes[{i}]",
            policy.base,
            confined=policy.confined,
        )
        decider = Decider(scoped, catalog, with_effects(scorer_for(scoped), scope), bound=policy)  # type: ignore[arg-type]
        out.append(ScopedDecider(scope.name, scope.match, decider))
    return tuple(out)
