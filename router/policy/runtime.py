"""Loading a policy into a decider, and picking up a changed policy without a restart.

A policy file and the learned artifact it pins are loaded and checked together; a reload that
fails validation is logged and the running policy stays, so a bad edit never drops traffic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from router.errors import ConfigError
from router.policy.catalog import Catalog, PriceLookup, build_catalog
from router.policy.config import Policy, load_policy
from router.policy.decide import Decider, Scorer
from router.policy.learned import Artifact, LearnedScorer, Objective

log = logging.getLogger("router.policy")


@dataclass(frozen=True)
class Runtime:
    policy: Policy
    catalog: Catalog
    decider: Decider


def scorer_for(policy: Policy) -> Scorer | None:
    spec = policy.spec
    if spec.learned is None or policy.learned_path is None:
        return None
    artifact = Artifact.load(policy.learned_path, spec.learned.sha256)
    unknown = sorted(set(artifact.models) - set(policy.models))
    if unknown:
        log.warning("learned artifact knows models not in the catalog (ignored): %s", ", ".join(unknown))
    o = spec.objective
    objective = Objective(
        max_attempts=o.max_attempts,
        min_success=o.min_success,
        max_cost_per_task=o.max_cost_per_task,
    )
    return LearnedScorer(artifact, objective)


def load_runtime(path: str | Path, lookup: PriceLookup | None = None) -> Runtime:
    policy = load_policy(path)
    catalog = build_catalog(policy, lookup)
    return Runtime(policy, catalog, Decider(policy, catalog, scorer_for(policy)))


class PolicyWatcher:
    """Polls the policy file and its artifact; on a change, loads and installs the new runtime."""

    def __init__(self, path: Path, install: Callable[[Runtime], None], current: Runtime) -> None:
        self.path = path
        self.install = install
        self._stamp = self._read_stamp(current)

    def _read_stamp(self, rt: Runtime) -> tuple[float, ...]:
        files = [self.path, *([rt.policy.learned_path] if rt.policy.learned_path else [])]
        return tuple(f.stat().st_mtime_ns if f.exists() else -1 for f in files)

    def check(self, current: Runtime) -> bool:
        """Reload if anything changed; return whether a new runtime was installed."""
        stamp = self._read_stamp(current)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            rt = load_runtime(self.path)
        except ConfigError as exc:
            log.error("policy change not applied, the running policy stays:\n%s", exc)
            return False
        self._stamp = self._read_stamp(rt)
        self.install(rt)
        log.info("policy reloaded: %s (%s)", rt.policy.name, rt.decider.scorer.name)
        return True

    async def run(self, current: Callable[[], Runtime], interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.check, current())
