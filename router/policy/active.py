"""Loading a policy into a decider, and picking up a changed policy without a restart.

A policy file and the learned artifact it pins are loaded and checked together; a reload that
fails validation is logged, remembered (``PolicyHistory.last_rejected``, shown by ``/readyz`` and
``GET /v1/policy``) and the running policy stays, so a bad edit never drops traffic.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from router.errors import ConfigError
from router.features.task.attempt import AttemptControl
from router.policy import prior as priors
from router.policy.artifact import Artifact
from router.policy.catalog import Catalog, PriceLookup, build_catalog, misspelt
from router.policy.config import Policy
from router.policy.control import CONTROL, TREATED, ControlArm, arm_of, build_control, control_path
from router.policy.decide import CheapestScorer, Decider, Scorer
from router.policy.learned import LearnedScorer, Objective
from router.policy.loading import parse_policy
from router.policy.revisions import PREVIOUS_SHOWN, Archive, PolicyFiles, Rejected
from router.policy.scopes import REPO_HEADER, TEAM_HEADER, ScopedDecider, ScopeFacts, build_scopes

log = logging.getLogger("router.policy")


#: What the providers whose wire protocol is fixed speak (others, Bedrock or Vertex, only through litellm).
_PROVIDER_PROTOCOLS = {
    "openai": frozenset({"openai", "openai_responses"}),
    "anthropic": frozenset({"anthropic"}),
}


@dataclass(frozen=True)
class ActivePolicy:
    """A policy loaded and ready to decide: the file, its catalog, its decider and the learned
    artifact it pins, checked together."""

    policy: Policy
    catalog: Catalog
    decider: Decider
    #: The bytes this runtime was built from (None for one built in code, as tests do).
    files: PolicyFiles | None = None
    applied_at: float = field(default_factory=time.time)
    control: ControlArm | None = None
    scopes: tuple[ScopedDecider, ...] = ()

    def arm_for(self, task_id: str | None, facts: ScopeFacts | None = None) -> tuple[str | None, Decider]:
        """The arm a task is in (None without a control arm) and the decider for it: the control
        arm's, else the first matching scope's, else the policy's own."""
        if self.control is not None and arm_of(task_id, self.control.share) == CONTROL:
            return CONTROL, self.control.decider
        arm = TREATED if self.control is not None else None
        if facts is not None:
            for scope in self.scopes:
                if scope.matches(facts):
                    return arm, scope.decider
        return arm, self.decider

    @cached_property  # read by every request: computed once per runtime
    def logged_headers(self) -> tuple[str, ...]:
        """The request headers the log keeps: those any decider's rules read, and the scopes' own."""
        deciders = [self.decider, *(s.decider for s in self.scopes)]
        if self.control is not None:
            deciders.append(self.control.decider)
        names = {h for d in deciders for h in d.rule_headers}
        if self.scopes:
            names |= {REPO_HEADER, TEAM_HEADER}
        return tuple(sorted(names))

    def warnings(self) -> list[str]:
        """What is valid but will not work as the file reads: a key variable not set, and a model
        no route names (added to ``models`` and to no route, it never gets a request, silently)."""
        deciders = [self.decider, *(s.decider for s in self.scopes)]
        if self.control is not None:
            deciders.append(self.control.decider)
        named = {
            m for d in deciders for r in d.policy.routes for m in (*r.candidates, *r.fallbacks, r.passthrough)
        }
        unrouted = [
            f"models.{m}: no route names it (in candidates, passthrough or fallbacks), so no request reaches it"
            for m in self.policy.models
            if m not in named
        ]
        return [*self.catalog.missing_credentials(), *unrouted, *self._mixed_protocols(),
                *misspelt(self.policy.spec.models)]  # fmt: skip

    def _mixed_protocols(self) -> list[str]:
        """A backend whose ``protocol`` is not what its litellm provider speaks: clients of that
        protocol are relayed to it as is, the others translated to the provider's, so its server
        must speak both (a slip in the file otherwise, found only by the first client it fails)."""
        out = []
        for b in self.catalog:
            speaks = _PROVIDER_PROTOCOLS.get(b.provider)
            if speaks is not None and b.protocol not in speaks:
                out.append(
                    f"models.{b.id}: protocol {b.protocol} but litellm_model {b.litellm_model!r} is "
                    f"{b.provider}'s ({' or '.join(sorted(speaks))}): {b.protocol} clients are relayed "
                    f"as is and the others translated to {b.provider}'s protocol, so the server must speak both"
                )
        return out

    @cached_property  # every request's log record names it: the files are hashed once per runtime
    def revision(self) -> str | None:
        return self.files.revision if self.files is not None else None


class ActivePolicyHolder:
    """The policy in force. A request reads ``current`` once, when it is admitted, and uses that
    snapshot to its end; a reload (``install``) swaps the whole policy in one assignment, so it
    never mixes two policies within a request."""

    def __init__(
        self, runtime: ActivePolicy, on_install: Callable[[ActivePolicy], None] | None = None
    ) -> None:
        self.current = runtime
        self._on_install = on_install

    def install(self, runtime: ActivePolicy) -> None:
        if self._on_install is not None:
            self._on_install(runtime)
        self.current = runtime


def _read(path: Path, what: str, named: str = "", hint: str = "") -> bytes:
    """``named``: the policy file and field that name ``path`` ("p.yaml: learned.artifact"), said
    first: "policies/learned/gone.json: cannot read learned artifact" named neither the policy that
    pins it nor the line to change. ``hint``: what to do when it does not exist."""
    try:
        return path.read_bytes()
    except OSError as exc:
        where = f"{named}: " if named else ""
        also = f" ({hint})" if hint and isinstance(exc, FileNotFoundError) else ""
        raise ConfigError(f"{where}{path}: cannot read {what}: {exc.strerror}{also}") from None


def _read_artifact(policy: Policy, path: Path) -> bytes:
    return _read(path, "learned artifact", f"{policy.source}: learned.artifact",
                 f"`router train --out FILE` writes one and `router promote FILE --config {policy.source}` pins it; "
                 "or remove the learned: section")  # fmt: skip


def load_artifact(policy: Policy, raw: bytes | None = None) -> Artifact | None:
    """The learned artifact the policy pins, its pin checked (``raw``: the file's bytes, if already read)."""
    spec = policy.spec
    if spec.learned is None or policy.learned_path is None:
        return None
    raw = _read_artifact(policy, policy.learned_path) if raw is None else raw
    return Artifact.from_json(raw, source=str(policy.learned_path), expected_sha256=spec.learned.sha256)


def scorer_for(policy: Policy, artifact: Artifact | None = None) -> Scorer | None:
    """The learned scorer the policy pins (``artifact``: the one ``load_artifact`` read for it, so
    a policy and its scopes, which pin the same file, parse it once); for an artifact of no
    models, the cheapest priced by its estimates."""
    if policy.spec.learned is None:
        return None
    artifact = artifact if artifact is not None else load_artifact(policy)
    if artifact is None:
        return None
    if not artifact.models:
        # Trained on a log without enough labels: no routing learned, only the sizes of a call.
        return CheapestScorer(artifact.estimates, f"cheapest:{artifact.sha256[:12]}")
    unknown = sorted(set(artifact.models) - set(policy.models))
    if unknown:
        log.warning("learned artifact knows models not in the catalog (ignored): %s", ", ".join(unknown))
    # Said at promotion too (the CLI shows warnings): an artifact trained on another catalog's log
    # routes those models blind, and nothing else would tell the operator why.
    unseen = [m for m in policy.models if m not in artifact.models]
    if unseen:
        log.warning("learned artifact has no labelled attempt of catalog models (an even chance until "
                    "a retrain on a log that has some): %s", ", ".join(unseen))  # fmt: skip
    return LearnedScorer(artifact, objective_for(policy, artifact))


def objective_for(policy: Policy, artifact: Artifact) -> Objective:
    """The policy's objective with its prior plan: the best fixed order on the training log for a
    value or a target (a target also gives the value that stands for it), and the margin a task's
    own plan must clear to leave it, as ``router train`` measured them (``router.policy.prior``).
    Without a value or a target, single shot (``max_attempts: 1``) serves the model with the least
    cost per completed task on the training log — the best single model — and a task leaves it only
    where its own plan paid out of fold (``priors.default_point``: the margin measured at the values
    at which that model is the prior). With retries and no value there is no prior plan: each task
    is planned alone at its own least cost per completed task (a deviation cannot be weighed without
    a value, and where the task features say much, as in the learning loop's test, a fixed order
    would throw that away)."""
    o = policy.spec.objective
    value = o.value_per_completed_usd
    k = o.max_attempts
    frontier = artifact.frontiers.get(k)
    if o.target is not None and frontier is None:
        known = ", ".join(map(str, sorted(artifact.frontiers))) or "none"
        raise ConfigError(
            f"{policy.source}: objective: the artifact has no prior plans for max_attempts={k} (it has: {known}); "
            "retrain with `router train --config` this policy"
        )
    prior: tuple[str, ...] | None = None
    margin = math.inf
    if frontier is not None and o.target is not None:
        point = priors.nearest(artifact.points.get(k, ()), target=o.target)
        # Chosen above the target, among orders as long, as `router train` measured it needs to
        # reach the target on tasks it was not chosen on (a target it did not measure: at itself).
        among, level = priors.for_target_above(
            artifact.frontiers, k, o.target, *((point.above, point.longest) if point is not None else ())
        )
        prior = priors.for_target(among, level).models
        # A target `router train` did not measure keeps to its prior plan (no margin was validated).
        value = point.value if point is not None else priors.value_of_target(among, level)
        margin = point.margin if point is not None else math.inf
    elif frontier is not None and value is not None:
        prior = priors.for_value(frontier, value).models
        point = priors.nearest(artifact.points.get(k, ()), value=value)
        margin = point.margin if point is not None else math.inf
    elif frontier is not None and k == 1:
        best = priors.least_cost_per_completed(frontier)
        if best.models:
            prior = best.models
            point = priors.default_point(frontier, artifact.points.get(k, ()), best)
            value = point.value if point is not None else priors.value_of_plan(frontier, best)
            margin = point.margin if point is not None else math.inf
    return Objective(
        max_attempts=k, value=value, max_cost_per_task=o.max_cost_per_task, prior=prior, margin=margin,
        target=o.target if frontier is not None else None,
        default=o.value_per_completed_usd is None and o.target is None and prior is not None,
    )  # fmt: skip


def attempt_controls(policy: Policy, artifact: Artifact) -> dict[str, AttemptControl]:
    """Per model of the policy, the learned cap and stop-loss; a cap in the file
    (``models.X.max_calls_per_attempt``) overrides the learned one."""
    out: dict[str, AttemptControl] = {}
    for model in policy.models:
        learned = artifact.controls.get(model, AttemptControl())
        own = policy.attempt_controls.get(model)
        control = replace(learned, max_calls=own.max_calls) if own is not None else learned
        if control.active:
            out[model] = control
    return out


def load_active_policy(path: str | Path, lookup: PriceLookup | None = None) -> ActivePolicy:
    """Each file is read once: what is validated is what the revision hashes and the archive keeps."""
    path = Path(path)
    return build_active_policy(_read(path, "policy file"), path, str(path), lookup)


def build_active_policy(
    text: bytes, path: Path, source: str, lookup: PriceLookup | None = None, *, posted: bool = False
) -> ActivePolicy:  # fmt: skip
    """A runtime from a policy's bytes; ``path`` places it (its artifact is relative to it),
    ``source`` names it in errors. ``posted``: the bytes came from a caller (the served preview),
    so they are not interpolated from the environment and read no file outside ``path``'s directory."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text: {exc}") from None
    env = None if posted else os.environ
    policy = parse_policy(decoded, source=source, env=env, base=path.parent, confined=posted)
    for warning in policy.warnings:
        log.warning("%s", warning)
    artifact = _read_artifact(policy, policy.learned_path) if policy.learned_path is not None else None
    learned = load_artifact(policy, artifact)
    catalog = build_catalog(policy, lookup)
    ref_path = control_path(policy)
    ref = (
        _read(ref_path, "control policy", f"{policy.source}: control.policy")
        if ref_path is not None
        else None
    )
    estimates = learned.estimates if learned is not None and learned.estimates.learned else None
    control = build_control(policy, catalog, ref_path, ref, scorer_for, estimates)
    files = PolicyFiles(path.resolve(), text, policy.learned_path, artifact, ref_path, ref)
    scorer = scorer_for(policy, learned)
    if isinstance(scorer, LearnedScorer):
        policy.use_attempt_controls(attempt_controls(policy, scorer.artifact))
    decider = Decider(policy, catalog, scorer)
    scopes = build_scopes(policy, catalog, lambda p: scorer_for(p, learned))
    return ActivePolicy(policy, catalog, decider, files, control=control, scopes=scopes)


class PolicyHistory:
    """What this router applied and refused: for ``GET /v1/policy``, ``/readyz`` and ``/metrics``."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        #: Set while the file on disk is one that failed to load; cleared by the next good load.
        self.last_rejected: Rejected | None = None
        self.rejected_reloads = 0
        #: Rollbacks this router's guard made (the archive knows every router's).
        self.rollbacks = 0
        #: The guard's last verdict on the revision in force (``router.rollout.guard``).
        self.guard: dict[str, Any] | None = None

    def applied(self, rt: ActivePolicy) -> None:
        self.last_rejected = None
        for line in rt.warnings():
            log.warning("policy %s: %s", rt.policy.name, line)
        if rt.files is not None:
            self.archive.keep(rt.files, rt.policy.name, rt.applied_at)

    def rejected(self, error: str) -> None:
        self.rejected_reloads += 1
        self.last_rejected = Rejected(time.time(), error)

    def describe(self, rt: ActivePolicy) -> dict[str, Any]:
        """The answer of ``GET /v1/policy``."""
        previous = self.archive.previous(rt.revision or "")[:PREVIOUS_SHOWN]
        return {
            "revision": rt.revision,
            "name": rt.policy.name,
            "source": rt.policy.source,
            "scorer": rt.decider.scorer.name,
            "artifact": str(rt.policy.learned_path) if rt.policy.learned_path else None,
            "applied_at": rt.applied_at,
            "previous": [
                {k: m.get(k) for k in ("revision", "name", "applied_at", "artifact", "rolled_back")}
                for m in previous
            ],
            "last_rejected": self.last_rejected.as_dict() if self.last_rejected else None,
            "last_rollback": self.archive.last_rollback(),
            "guard": self.guard if self.guard and self.guard.get("revision") == rt.revision else None,
        }


class PolicyWatcher:
    """Polls the policy file and its artifact; on a change, loads and installs the new runtime."""

    def __init__(
        self, path: Path, install: Callable[[ActivePolicy], None], current: ActivePolicy,
        history: PolicyHistory | None = None,
    ) -> None:  # fmt: skip
        self.path = path
        self.install = install
        self.history = history or PolicyHistory(Archive(path))
        self._stamp = self._read_stamp(current)

    def _read_stamp(self, rt: ActivePolicy) -> tuple[float, ...]:
        referenced = (
            (rt.files.artifact_path, rt.files.control_path) if rt.files else (rt.policy.learned_path,)
        )
        # The label model too: a file changed under its pin must be refused now, on /readyz, not
        # at whatever reload comes next.
        files = [self.path, *(f for f in (*referenced, rt.policy.label_model_path) if f is not None)]
        return tuple(f.stat().st_mtime_ns if f.exists() else -1 for f in files)

    def check(self, current: ActivePolicy) -> bool:
        """Reload if anything changed; return whether a new runtime was installed."""
        stamp = self._read_stamp(current)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            rt = load_active_policy(self.path)
        except ConfigError as exc:
            log.error("policy change not applied, the running policy stays:\n%s", exc)
            self.history.rejected(str(exc))
            return False
        self._stamp = self._read_stamp(rt)
        refused = self.history.last_rejected is not None
        self.history.applied(rt)
        if rt.revision is not None and rt.revision == current.revision:
            if refused:  # the console's last word on the file was its error: say that is over
                log.info(
                    "policy file loads again: %s revision %s, the one running, stays",
                    rt.policy.name,
                    rt.revision,
                )
            return False  # touched, not changed: the running revision stays, with its time
        self.install(rt)
        log.info("policy reloaded: %s revision %s (%s)", rt.policy.name, rt.revision, rt.decider.scorer.name)
        return True

    async def run(self, current: Callable[[], ActivePolicy], interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.check, current())
