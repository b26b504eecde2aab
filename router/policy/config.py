"""The policy file's schema, and the compiled ``Policy`` it becomes.

A policy file holds the model catalog, the routes from a client's requested model to candidate
backends, and data-only rules. Every field is validated with pydantic (unknown keys are errors);
``Policy`` compiles rule conditions and checks references between sections, so that a bad file
fails at startup with the file and field path in the message. Reading the file (YAML, ``${VAR}``,
error messages) is ``router.policy.loading``.
"""

from __future__ import annotations

import difflib
import fnmatch
import typing
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from router.errors import ConfigError
from router.features.labels.model import LabelModel
from router.features.labels.model import default as default_labels
from router.features.request import RULE_FIELDS, Features
from router.features.task.attempt import AttemptControl
from router.features.task.rules import TaskRules
from router.policy.modelspec import ModelSpec, Strict
from router.policy.rules import Condition, compile_condition


class Targets(Strict):
    """Backends of a route: candidates to choose among, or one model, and fallbacks."""

    #: Candidate model ids the policy chooses among.
    candidates: list[str] = Field(default_factory=list)
    #: Send every request to this one model (no choice), still with fallbacks.
    passthrough: str | None = None
    #: Tried in order after the candidates, when all of those fail.
    fallbacks: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_target(self) -> Targets:
        if self.candidates and self.passthrough:
            raise ValueError("give candidates or passthrough, not both")
        if not self.candidates and not self.passthrough:
            # An empty list read as absent: "give exactly one" did not say which was wrong.
            raise ValueError(
                "no backend: give candidates (a non-empty list of model ids) or passthrough (one id)"
            )
        # A model listed twice loaded "ok": exploring picked it twice as often as the propensity
        # logged for it says (off-policy estimates divide by that), and a failure tried it again.
        for name in ("candidates", "fallbacks"):
            given: list[str] = getattr(self, name)
            twice = next((m for i, m in enumerate(given) if m in given[:i]), None)
            if twice is not None:
                raise ValueError(f"{name}: {twice!r} is listed twice")
        return self

    @property
    def chosen_among(self) -> list[str]:
        """The backends a decision ranks: the candidates, or the passthrough model alone."""
        return [self.passthrough] if self.passthrough else list(self.candidates)


class Route(Targets):
    """Maps a requested model name (exact, or a glob such as ``claude-*``) to backends."""

    match: Annotated[str, Field(min_length=1)]

    def matches(self, requested: str) -> bool:
        return fnmatch.fnmatchcase(requested, self.match)


class Rule(Strict):
    """When ``when`` holds, filter the candidates (only/exclude) or move some to the front (prefer)."""

    name: Annotated[str, Field(min_length=1)]
    when: dict[str, Any]
    only: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    prefer: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_effect(self) -> Rule:
        if self.only is None and not self.exclude and not self.prefer:
            raise ValueError("a rule needs at least one of only, exclude, prefer")
        return self


class Defaults(Strict):
    """Estimates used before the log can teach better ones."""

    #: Output tokens assumed when the client sets no limit, until the learned artifact has the
    #: backend's mean (``router.policy.estimates``).
    expected_output_tokens: int = Field(default=1024, gt=0)
    #: The least output reserved when checking that a prompt fits, when the client sets no limit;
    #: the backend's learned 90th percentile raises it, never lowers it (``Decider.reserve``).
    reserve_output_tokens: int = Field(default=4096, gt=0)
    #: Calls of each hosted tool a request declares (a web search, ...) that a budget holds for,
    #: at the backend's per-call price: what one reply may call is not known before it. A tool
    #: the request caps lower (Anthropic's ``max_uses``) holds its cap.
    held_tool_calls: int = Field(default=1, ge=0)
    #: Calls of each hosted tool a request declares without a cap of its own (``max_uses``) that
    #: a key's budget holds for at most (``Estimate.worst_usd``): the provider may call it more
    #: often than the one held, and near a budget's end requests in flight could together call
    #: past it. A reply that calls more is charged what it called, past the worst case.
    worst_tool_calls: int = Field(default=10, ge=0)


class LearnedRef(Strict):
    """A trained artifact, pinned by hash so that what runs is what was evaluated."""

    #: Path to the JSON artifact, relative to this policy file.
    artifact: Annotated[str, Field(min_length=1)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]


class Exploration(Strict):
    #: Share of decisions made uniformly at random among eligible candidates (logged with its propensity).
    epsilon: float = Field(default=0.0, ge=0, le=1)
    #: Fixes the random choices, for reproducible experiments (unset: a fresh seed per process).
    seed: int | None = None


class ObjectiveSpec(Strict):
    """What the learned policy optimises: ``value · P(success) − E[cost]`` per task, stopping
    when another attempt is worth less than it costs.

    The value of a completed task is given (``value_per_completed_usd``) or found by ``router train``
    as the one at which the policy completes ``target_success`` of the training tasks. With
    neither, each task is valued at its own least cost per completed task (never stops).
    """

    max_attempts: int = Field(default=3, ge=1, le=10)
    value_per_completed_usd: float | None = Field(default=None, gt=0)
    #: A fleet-wide share of tasks completed (not a per-task floor).
    target_success: float | None = Field(default=None, gt=0, lt=1)
    #: Deprecated: read as target_success, with a warning saying so.
    min_success: float | None = Field(default=None, ge=0, le=1)
    #: Per-task budget in USD; as it runs out the plan steps down to cheaper models.
    max_cost_per_task: float | None = Field(default=None, gt=0)
    exploration: Exploration = Exploration()

    @model_validator(mode="after")
    def _one_value(self) -> ObjectiveSpec:
        given = [
            n
            for n in ("value_per_completed_usd", "target_success", "min_success")
            if getattr(self, n) is not None
        ]
        if len(given) > 1:
            raise ValueError(
                f"give one of value_per_completed_usd, target_success (got {' and '.join(given)})"
            )
        return self

    @property
    def target(self) -> float | None:
        return self.target_success if self.target_success is not None else self.min_success


#: What an old file's ``min_success`` becomes, and why.
MIN_SUCCESS_DEPRECATED = (
    "objective.min_success is deprecated: it was applied per task, where after one failure it buys "
    "expensive escalation; it is read as objective.target_success: {v:g} (the share of all tasks "
    "completed, calibrated by `router train`). Write `target_success: {v:g}` or "
    "`value_per_completed_usd: <USD a completed task is worth>` instead"
)


class TasksSpec(Strict):
    #: A task with no request for this long and no outcome counts as abandoned (a failure) in training.
    abandon_after_s: float = Field(default=1800, gt=0)
    #: Tool-less calls with at most this many output tokens and a short history are side calls.
    side_call_max_tokens: int = Field(default=1024, ge=0)
    #: The same tool call repeated this many times is a loop (a reason to switch models).
    loop_threshold: int = Field(default=3, ge=2)
    #: The outcome label model (`router train` fits one from explicit outcomes); the one shipped
    #: with the router when unset.
    label_model: LearnedRef | None = None
    #: Leave the pinned model (once per attempt, where another may take over) when the attempt's
    #: P(success) falls below this. Off by default: on real agent runs the label is not sharp
    #: enough to act on alone (docs/learning.md, "Outcome labels").
    escalate_below: float | None = Field(default=None, gt=0, lt=1)


class ControlSpec(Strict):
    """A permanent control arm: a stable share of tasks decided by a reference policy."""

    #: Share of tasks (by a hash of the task id) the reference policy decides.
    share: float = Field(gt=0, lt=1)
    #: A policy file (relative to this one) whose routes, rules and learned model decide the
    #: control arm; its models must be in this file's catalog.
    policy: Annotated[str, Field(min_length=1)] | None = None
    #: Or: these backends for every route of this file, no rules, cheapest first.
    route: Targets | None = None

    @model_validator(mode="after")
    def _one_reference(self) -> ControlSpec:
        if (self.policy is None) == (self.route is None):
            raise ValueError("give exactly one of policy or route")
        return self


class GuardSpec(Strict):
    """Roll back by itself when the treated arm does significantly worse than control."""

    #: Tolerated drop in success rate (absolute: 0.03 = 3 points) before rolling back.
    max_success_drop: float = Field(default=0.03, ge=0, lt=1)
    #: Tolerated relative rise in cost per completed task (0.10 = 10%).
    max_cost_per_completed_increase: float = Field(default=0.10, ge=0)
    #: Tasks with an outcome needed in each arm before the test may decide.
    min_tasks: int = Field(default=200, ge=2)
    #: Chance of a rollback when the treated arm is within the tolerances (both tests together).
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    #: How often the log is read to update the test.
    check_every_s: float = Field(default=60.0, gt=0)
    #: Harm must still be found without this share of the virtual keys with outcomes (at least
    #: one key): those that weigh most for a rollback are left out (``router.rollout.guard.judge``).
    key_share: float = Field(default=0.1, ge=0, lt=1)


class ScopeMatch(Strict):
    """Globs that must all hold: the repository (``owner/name``: the ``X-Router-Repo`` header, else
    a github.com URL in the system prompt or first user message), the virtual key's id, the team
    (the virtual key's, ``router keys create --team``; the ``X-Router-Team`` header only for the
    master key and open mode)."""

    repo: Annotated[str, Field(min_length=1)] | None = None
    key: Annotated[str, Field(min_length=1)] | None = None
    team: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _something(self) -> ScopeMatch:
        if self.repo is None and self.key is None and self.team is None:
            raise ValueError("give at least one of repo, key, team")
        return self


class Scope(Strict):
    """Tasks matching ``match`` are decided with these routes, rules or objective instead. A scope
    with none of them names tasks for the learned model's per-scope effects (``router train``)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    match: ScopeMatch
    routes: list[Route] | None = None
    rules: list[Rule] | None = None
    objective: ObjectiveSpec | None = None


class PolicyFile(Strict):
    version: Literal[1] = 1
    name: str = "default"
    # Empty, the file checked "ok" and the router refused every request as an unknown model.
    models: list[ModelSpec] = Field(min_length=1)
    routes: list[Route] = Field(min_length=1)
    rules: list[Rule] = Field(default_factory=list)
    defaults: Defaults = Defaults()
    learned: LearnedRef | None = None
    objective: ObjectiveSpec = ObjectiveSpec()
    tasks: TasksSpec = TasksSpec()
    control: ControlSpec | None = None
    guard: GuardSpec | None = None
    #: Per-repository, per-key, per-team overrides; the first that matches a task applies.
    scopes: list[Scope] = Field(default_factory=list)


class CompiledRule:
    __slots__ = ("condition", "exclude", "name", "only", "prefer")

    def __init__(self, rule: Rule, condition: Condition) -> None:
        self.name = rule.name
        self.condition = condition
        self.only = frozenset(rule.only) if rule.only is not None else None
        self.exclude = frozenset(rule.exclude)
        self.prefer = tuple(rule.prefer)


class Policy:
    """A validated policy file, with rules compiled and references checked."""

    def __init__(
        self, spec: PolicyFile, source: str, base: Path | None = None, *, confined: bool = False
    ) -> None:
        """``base``: the directory the file's paths are relative to (the file's own by default);
        ``confined``: paths may not leave it (a policy posted to the server, whose paths would
        otherwise let a caller read, or learn the hash of, any file the router can)."""
        self.spec = spec
        self.source = source
        self.base = Path(source).parent if base is None else base
        self.confined = confined
        self.name = spec.name
        self.models: dict[str, ModelSpec] = {m.id: m for m in spec.models}
        self.routes = spec.routes
        self.defaults = spec.defaults
        self.objective = spec.objective
        #: Things the operator should change, for the loader to log.
        self.warnings: list[str] = []
        if spec.objective.min_success is not None:
            self.warnings.append(f"{source}: " + MIN_SUCCESS_DEPRECATED.format(v=spec.objective.min_success))
        self.learned_path = self.file(spec.learned.artifact, "learned.artifact") if spec.learned else None
        ref = spec.tasks.label_model
        self.label_model_path = self.file(ref.artifact, "tasks.label_model.artifact") if ref else None
        self.label_model = (
            LabelModel.load(self.label_model_path, ref.sha256)
            if ref is not None and self.label_model_path is not None
            else default_labels()
        )
        #: Per model, the rules that end an attempt early: the file's caps here; the runtime adds
        #: what the learned artifact holds (``router.policy.active.attempt_controls``).
        self.attempt_controls: dict[str, AttemptControl] = {
            m.id: AttemptControl(max_calls=m.max_calls_per_attempt)
            for m in spec.models
            if m.max_calls_per_attempt is not None
        }
        self.task_rules = TaskRules(
            side_call_max_tokens=spec.tasks.side_call_max_tokens,
            loop_threshold=spec.tasks.loop_threshold,
            escalate_below=spec.tasks.escalate_below,
            max_cost_per_task=spec.objective.max_cost_per_task,
            label_model=self.label_model,
            attempt_controls=self.attempt_controls,
            abandon_after_s=spec.tasks.abandon_after_s,
        )
        self.rules = [
            CompiledRule(r, compile_condition(r.when, where=f"{source}: rules[{i}] (name {r.name!r}).when", kinds=RULE_KINDS))
            for i, r in enumerate(spec.rules)
        ]  # fmt: skip
        self._check_references()

    def file(self, relative: str, field: str) -> Path:
        """A path the policy names, resolved against its directory."""
        path = (self.base / relative).resolve()
        if self.confined and not path.is_relative_to(self.base.resolve()):
            raise ConfigError(
                f"{self.source}: {field}: {relative!r} is outside the policy's directory "
                "(a posted policy reads only files beside the running one)"
            )
        return path

    def use_attempt_controls(self, controls: dict[str, AttemptControl]) -> None:
        """The controls in force, the learned ones included (``router.policy.active``)."""
        self.attempt_controls = controls
        self.task_rules = replace(self.task_rules, attempt_controls=controls)

    def route_for(self, requested: str) -> Route | None:
        for route in self.routes:
            if route.matches(requested):
                return route
        return None

    def _check_references(self) -> None:
        if len(self.models) != len(self.spec.models):
            seen: set[str] = set()
            for i, m in enumerate(self.spec.models):
                if m.id in seen:
                    raise ConfigError(f"{self.source}: models[{i}] (id {m.id!r}): duplicate model id")
                seen.add(m.id)

        def check(ids: list[str] | str | None, path: str) -> None:
            # A list's items are named by index; a single id (passthrough) by its field alone.
            items = (
                [(path, ids)]
                if isinstance(ids, str)
                else [(f"{path}[{j}]", m) for j, m in enumerate(ids or [])]
            )
            for at, mid in items:
                if mid not in self.models:
                    near = difflib.get_close_matches(mid, list(self.models), n=1, cutoff=0.6)
                    hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(self.models)})"
                    raise ConfigError(f"{self.source}: {at}: unknown model id {mid!r}{hint}")

        for i, route in enumerate(self.routes):
            where = f"routes[{i}] (match {route.match!r})"
            check(route.candidates, f"{where}.candidates")
            check(route.fallbacks, f"{where}.fallbacks")
            check(route.passthrough, f"{where}.passthrough")
        named: dict[str, int] = {}
        for i, (rule, compiled) in enumerate(zip(self.spec.rules, self.rules, strict=True)):
            where = f"rules[{i}] (name {rule.name!r})"
            if (first := named.setdefault(rule.name, i)) != i:
                # A scope's rule replaces every rule of its name: it could not say which it meant.
                raise ConfigError(
                    f"{self.source}: {where}.name: duplicate rule name (rules[{first}] has it; "
                    "a scope's rule replaces rules by name)"
                )
            check(rule.only, f"{where}.only")
            check(rule.exclude, f"{where}.exclude")
            check(rule.prefer, f"{where}.prefer")
            for field in compiled.condition.fields():
                if field not in RULE_FIELDS and not field.startswith("headers."):
                    raise ConfigError(
                        f"{self.source}: {where}.when: unknown feature {field!r} {_feature_hint(field)}"
                    )


def check_reachable(source: str, routes: list[Route], path: str = "routes") -> None:
    """The first matching route wins: a route whose every request an earlier one takes is a slip
    (a pasted route, an override placed after the glob it meant to narrow). Checked on the file's
    own lists only: a scope's routes come first over the policy's and may shadow them on purpose."""
    for i, route in enumerate(routes):
        literal = not any(c in route.match for c in "*?[")
        for j, earlier in enumerate(routes[:i]):
            if earlier.match == route.match or (literal and earlier.matches(route.match)):
                raise ConfigError(
                    f"{source}: {path}[{i}] (match {route.match!r}): never used: {path}[{j}] "
                    f"(match {earlier.match!r}) matches every request it would"
                )


def _kind_of(annotation: Any) -> str:
    types = set(typing.get_args(annotation)) or {annotation}
    return "boolean" if bool in types else "number" if types & {int, float} else "string"


#: What each feature a rule may test holds, from ``Features``'s fields.
RULE_KINDS: dict[str, str] = {
    name: _kind_of(hint) for name, hint in typing.get_type_hints(Features).items() if name in RULE_FIELDS
}


def _feature_hint(field: str) -> str:
    """The nearest feature a rule may test, else the list of them."""
    head, dot, rest = field.partition(".")
    if dot and difflib.get_close_matches(head, ["headers"], n=1, cutoff=0.6):
        return f"(did you mean 'headers.{rest}'?)"
    near = difflib.get_close_matches(field, list(RULE_FIELDS), n=1, cutoff=0.6)
    if near:
        return f"(did you mean {near[0]!r}?)"
    return f"(known: {', '.join(sorted(RULE_FIELDS))}, headers.<name>)"
