"""The guard: roll back by itself when the treated arm does significantly worse than control.

The test is a mixture sequential probability ratio test (mSPRT; Robbins 1970, as used for
always-valid A/B testing by Johari, Pekelis & Walsh, 2017). For an estimated difference ``d``
with variance ``V`` (normal approximation), and a normal mixture N(0, τ²) over the alternatives,

    Λ = sqrt(V / (V + τ²)) · exp(τ² d² / (2 V (V + τ²)))

is a nonnegative martingale with mean 1 while the null holds, so by Ville's inequality
P(Λ ever reaches 1/α) ≤ α. That is why the guard may look as often as it likes (every
``check_every_s``, as outcomes keep arriving) with its false-alarm rate still at most α: a
fixed-sample z-test repeated at each look would cross its threshold by chance far more often.

Two nulls are tested, each at α/2 (a union bound keeps the pair at α):

* success: ``p_control − p_treated − max_success_drop ≤ 0`` (the treated arm loses at most the
  tolerated points), tested on ``d = p̂_c − p̂_t − max_success_drop``;
* cost: ``log(cpc_treated / cpc_control) − log(1 + max_increase) ≤ 0`` for cost per completed
  task, with the delta method's variances of the two ratios.

A null is rejected only when ``d > 0`` and Λ ≥ 2/α (one side of a two-sided mixture: a
conservative bound at the null's edge, and further inside the null the crossing is rarer still).
τ is the tolerance itself (the size of harm worth detecting quickly). The approximations: the
normal law of the means and plug-in variances (hence ``min_tasks`` per arm before any decision;
a label's confidence makes a task count between 0 and 1, whose variance p(1−p) still bounds;
success rates are smoothed by half a success and half a failure so that an arm at 0% or 100%
has a variance), and independent tasks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.errors import ConfigError
from router.learning.arms import ArmTasks, TaskTally, ratio_of_means
from router.policy.config import GuardSpec
from router.policy.control import CONTROL, TREATED
from router.policy.revisions import rollback
from router.policy.runtime import PolicyHistory, Runtime
from router.store import Store

log = logging.getLogger("router.guard")

Row = Mapping[str, Any]

#: How far back each check reads requests again (a request is logged when it ends).
READ_OVERLAP_S = 3600.0


def msprt(d: float, var: float, tau2: float) -> float:
    """The mixture likelihood ratio Λ for an estimate ``d`` of variance ``var`` (null: 0)."""
    if var <= 0:
        return math.inf if d != 0 else 1.0
    return math.sqrt(var / (var + tau2)) * math.exp(min(700.0, tau2 * d * d / (2 * var * (var + tau2))))


@dataclass(frozen=True, slots=True)
class Verdict:
    worse: bool
    #: Why (which null was rejected), or why no decision could be made yet.
    reason: str
    success_lr: float | None = None
    cost_lr: float | None = None
    control_tasks: int = 0
    treated_tasks: int = 0


def _rate(a: ArmTasks) -> tuple[float, float]:
    """Success rate and its variance, smoothed by half a success and half a failure."""
    n = a.n
    p = (sum(a.success) + 0.5) / (n + 1)
    return sum(a.success) / n, p * (1 - p) / n


def judge(control: ArmTasks, treated: ArmTasks, spec: GuardSpec) -> Verdict:
    nc, nt = control.n, treated.n
    if min(nc, nt) < spec.min_tasks:
        return Verdict(False, f"waiting: {nc} control and {nt} treated tasks with an outcome, "
                              f"{spec.min_tasks} needed in each", control_tasks=nc, treated_tasks=nt)  # fmt: skip
    threshold = 2 / spec.alpha
    pc, vc = _rate(control)
    pt, vt = _rate(treated)
    d = pc - pt - spec.max_success_drop
    tau = max(spec.max_success_drop, 0.01)
    success_lr = msprt(d, vc + vt, tau * tau)
    if d > 0 and success_lr >= threshold:
        return Verdict(True, f"success {pt:.1%} treated vs {pc:.1%} control: more than "
                             f"{spec.max_success_drop:.1%} worse (mSPRT Λ={success_lr:.3g} ≥ {threshold:g})",
                       success_lr, None, nc, nt)  # fmt: skip
    cost_lr = None
    rc, rt = ratio_of_means(control.cost, control.success), ratio_of_means(treated.cost, treated.success)
    if rc is not None and rt is not None and rc[0] > 0 and rt[0] > 0:
        margin = math.log1p(spec.max_cost_per_completed_increase)
        d_cost = math.log(rt[0] / rc[0]) - margin
        var = rc[1] / rc[0] ** 2 + rt[1] / rt[0] ** 2
        tau_cost = max(margin, 0.05)
        cost_lr = msprt(d_cost, var, tau_cost * tau_cost)
        if d_cost > 0 and cost_lr >= threshold:
            return Verdict(True, f"cost per completed task ${rt[0]:.5f} treated vs ${rc[0]:.5f} control: more "
                                 f"than {spec.max_cost_per_completed_increase:.0%} higher "
                                 f"(mSPRT Λ={cost_lr:.3g} ≥ {threshold:g})", success_lr, cost_lr, nc, nt)  # fmt: skip
    return Verdict(False, "no significant harm", success_lr, cost_lr, nc, nt)


class Guard:
    """Reads the log every ``check_every_s`` and rolls the policy back when ``judge`` says so.

    Every replica runs one; they read the same log (a shared store) and the same archive, and a
    rollback happens once: it only goes ahead while the revision judged is still the archive's
    revision in force (``rollback(expect=...)``, under a lock).
    """

    def __init__(
        self, store: Store, history: PolicyHistory, publish: Callable[[str], Awaitable[None]],
        reload: Callable[[], Awaitable[None]],
    ) -> None:  # fmt: skip
        self.store = store
        self.history = history
        self.publish = publish
        self.reload = reload
        self._tally: TaskTally | None = None
        self._since = self._cursor = 0.0
        #: The revision found worse with no earlier one to put back (warned about once).
        self._stuck: str | None = None

    async def check(self, rt: Runtime) -> Verdict | None:
        spec = rt.policy.spec.guard
        if spec is None or rt.control is None or rt.revision is None:
            return None
        tally = self._tally_for(rt)
        # Only the last READ_OVERLAP_S of requests is read again: rows are written when a request
        # ends, so one that began earlier may have been written since the last read.
        requests = await self.store.requests_since(max(self._since, self._cursor - READ_OVERLAP_S))
        outcomes = await self.store.outcomes_since(self._since)
        verdict = await asyncio.to_thread(self._judge, tally, requests, outcomes, spec)
        self.history.guard = {"revision": rt.revision, "at": time.time(), **dataclasses.asdict(verdict)}
        if verdict.worse:
            await self._roll_back(rt.revision, verdict)
        return verdict

    def _judge(
        self, tally: TaskTally, requests: Sequence[Row], outcomes: Sequence[Row], spec: GuardSpec
    ) -> Verdict:
        tally.add(requests)
        self._cursor = max([self._cursor, *(float(r["ts"]) for r in requests)])
        tally.forget_before(self._cursor - READ_OVERLAP_S)
        arms = tally.arms(outcomes)
        return judge(arms.get(CONTROL, ArmTasks()), arms.get(TREATED, ArmTasks()), spec)

    def _tally_for(self, rt: Runtime) -> TaskTally:
        """The tally of the revision's current time in force: only requests decided under it
        that arrived since it was (last) applied, and the outcomes of their tasks.

        A revision put back (``router rollback --to``) carries the same id as in its earlier time
        in force, so its rows from then would be judged again: with a minute of slack for
        replicas' clocks, a rollback within a minute was judged at once on the tasks it had been
        rolled back for. Without the slack, a replica whose clock is behind loses its first
        requests under the revision (never counting someone else's)."""
        since = self.history.archive.since(rt.revision or "") or rt.applied_at
        if self._tally is None or self._tally.revision != rt.revision or self._tally.since != since:
            self._since = self._cursor = since
            self._tally = TaskTally(rt.revision, since=since, latency=False)
        return self._tally

    async def _roll_back(self, revision: str, verdict: Verdict) -> None:
        reason = f"guard: {verdict.reason}"
        try:
            done = await asyncio.to_thread(
                rollback, self.history.archive, None, reason, time.time(), revision
            )
        except ConfigError as exc:
            # Nothing to go back to (the earlier revisions were rolled back themselves, or none was
            # archived): the revision stays. Said once per revision, and shown in GET /v1/policy.
            if self._stuck != revision:
                self._stuck = revision
                log.warning(
                    "policy revision %s is worse than control (%s) but stays: %s", revision, reason, exc
                )
            if self.history.guard is not None:
                self.history.guard["rollback"] = f"not possible: {exc}"
            return
        if done is None:
            return  # another replica rolled it back already
        old, new = done
        self.history.rollbacks += 1
        log.warning("policy rolled back from revision %s to %s: %s", old, new, reason)
        try:
            await self.publish(new)
        except Exception as exc:  # the replicas still see the file change at their next poll
            log.warning(
                "rollback not published to the other replicas (%s); they reload at their next poll", exc
            )
        await self.reload()

    async def run(self, current: Callable[[], Runtime]) -> None:
        while True:
            spec = current().policy.spec.guard
            await asyncio.sleep(spec.check_every_s if spec is not None else 60.0)
            try:
                await self.check(current())
            except Exception:
                log.exception("policy guard check failed; trying again at the next interval")
