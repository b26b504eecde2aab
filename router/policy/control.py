"""The permanent control arm: a stable share of tasks decided by a reference policy.

A task's arm comes from a hash of its task id, never from the request: every request of a task,
on every replica and after every restart, is decided by the same arm, and raising the share only
moves tasks from treated to control, never back. The reference is another policy file (its
routes, rules and learned model; its models must be in the main catalog, which serves both arms)
or a plain ``route`` applied to every route of the main file (no rules, cheapest first).
Neither arm explores: the comparison is between the two policies as they decide.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from router.errors import ConfigError
from router.policy.catalog import Catalog
from router.policy.config import Policy, Route
from router.policy.decide import Decider, Scorer
from router.policy.estimates import Estimates
from router.policy.loading import parse_policy

CONTROL = "control"
TREATED = "treated"


def arm_of(task_id: str | None, share: float) -> str:
    """``control`` for a ``share`` of task ids (uniform, stable), else ``treated``."""
    if task_id is None:
        return TREATED
    digest = hashlib.blake2b(task_id.encode(), digest_size=8, person=b"router-arm").digest()
    return CONTROL if int.from_bytes(digest, "big") / 2**64 < share else TREATED


@dataclass(frozen=True)
class ControlArm:
    share: float
    decider: Decider
    #: What decides it: "route", or the reference policy's path.
    reference: str


def control_path(policy: Policy) -> Path | None:
    """The reference policy file, if the control arm names one (relative to the policy's directory)."""
    spec = policy.spec.control
    if spec is None or spec.policy is None:
        return None
    return policy.file(spec.policy, "control.policy")


def build_control(
    policy: Policy, catalog: Catalog, path: Path | None, text: bytes | None,
    scorer_for: Callable[[Policy], Scorer | None], estimates: Estimates | None = None,
) -> ControlArm | None:  # fmt: skip
    """The control arm of ``policy``; ``path``, ``text``: the reference policy file and its bytes
    (if it names one); ``scorer_for(policy)``: how the reference's learned model is loaded;
    ``estimates``: the running policy's learned sizes of a call (None: the reference's own, else
    priors). They are facts about the backends, not a routing choice: an arm priced on priors held
    ~3.6x a call's money (the flat output default) and ran into budgets first, which the arms'
    comparison would have counted against the reference."""
    spec = policy.spec.control
    if spec is None:
        if policy.spec.guard is not None:
            raise ConfigError(f"{policy.source}: guard: needs a control arm (control:) to compare with")
        return None
    if spec.route is not None:
        r = spec.route
        routes = [Route(match=x.match, candidates=r.candidates, passthrough=r.passthrough, fallbacks=r.fallbacks)
                  for x in policy.routes]  # fmt: skip
        ref = policy.spec.model_copy(update={"name": f"{policy.name}/control", "routes": routes, "rules": [],
                                             "learned": None, "control": None, "guard": None})  # fmt: skip
        decider = Decider(
            Policy(ref, f"{policy.source}: control.route", policy.base, confined=policy.confined),
            catalog,
            estimates=estimates,
        )
        reference = "route"
    else:
        assert path is not None
        decider = _reference_policy(policy, catalog, path, text, scorer_for, estimates)
        reference = str(path)
    decider.epsilon = 0.0
    return ControlArm(spec.share, decider, reference)


def _reference_policy(
    policy: Policy, catalog: Catalog, path: Path, text: bytes | None,
    scorer_for: Callable[[Policy], Scorer | None], estimates: Estimates | None,
) -> Decider:  # fmt: skip
    where = f"{policy.source}: control.policy"
    if text is None:
        raise ConfigError(f"{where}: cannot read {path}")
    # A reference read for a posted policy is still a file beside the running one, the operator's own.
    ref = parse_policy(
        text.decode("utf-8", "replace"), source=str(path), env=os.environ, confined=policy.confined
    )
    if ref.spec.control is not None or ref.spec.guard is not None or ref.spec.scopes:
        raise ConfigError(
            f"{where}: {path} has a control arm, guard or scopes of its own (a reference cannot)"
        )
    missing = sorted(set(ref.models) - set(catalog.backends))
    if missing:
        raise ConfigError(f"{where}: models of {path} not in this file's catalog: {', '.join(missing)}")
    return Decider(ref, catalog, scorer_for(ref), estimates=estimates)
