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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from router.errors import ConfigError
from router.policy.active import ActivePolicy, PolicyHistory
from router.policy.config import GuardSpec
from router.policy.control import CONTROL, TREATED
from router.rollout.arms import ArmTasks, TaskTally
from router.rollout.rollback import rollback
from router.store import OutcomeRecord, RequestRecord, Store

log = logging.getLogger("router.guard")


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
    #: Virtual keys whose tasks were left out before a rollback was allowed (see ``judge``).
    keys_left_out: int = 0


@dataclass(frozen=True, slots=True)
class Moments:
    """An arm's tasks with a verdict as sums (success ``y``, cost ``x``): what the tests need, and
    what one key's tasks can be subtracted from in O(1)."""

    n: int = 0
    y: float = 0.0
    x: float = 0.0
    yy: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    @classmethod
    def of(cls, success: Sequence[float], cost: Sequence[float]) -> Moments:
        return cls(len(success), sum(success), sum(cost), sum(y * y for y in success),
                   sum(x * x for x in cost), sum(x * y for x, y in zip(cost, success, strict=True)))  # fmt: skip

    def __sub__(self, o: Moments) -> Moments:
        return Moments(
            self.n - o.n, self.y - o.y, self.x - o.x, self.yy - o.yy, self.xx - o.xx, self.xy - o.xy
        )

    def __add__(self, o: Moments) -> Moments:
        return Moments(
            self.n + o.n, self.y + o.y, self.x + o.x, self.yy + o.yy, self.xx + o.xx, self.xy + o.xy
        )

    def rate(self) -> tuple[float, float]:
        """Success rate and its variance, smoothed by half a success and half a failure."""
        p = (self.y + 0.5) / (self.n + 1)
        return self.y / self.n, p * (1 - p) / self.n

    def cost_per_completed(self) -> tuple[float, float] | None:
        """``arms.ratio_of_means(cost, success)`` from the sums."""
        n = self.n
        if n < 2 or self.y <= 0:
            return None
        mn, md = self.x / n, self.y / n
        r = mn / md
        vn = max(0.0, self.xx - n * mn * mn) / (n - 1)
        vd = max(0.0, self.yy - n * md * md) / (n - 1)
        cov = (self.xy - n * mn * md) / (n - 1)
        return r, max(0.0, (vn - 2 * r * cov + r * r * vd) / (n * md * md))


def _test(control: Moments, treated: Moments, spec: GuardSpec) -> tuple[Verdict, float]:
    """The two sequential tests on all the tasks given; with the verdict, the evidence for harm
    (the larger Λ of a null whose estimate points to harm, else 0)."""
    nc, nt = control.n, treated.n
    if min(nc, nt) < spec.min_tasks:
        return Verdict(False, f"waiting: {nc} control and {nt} treated tasks with an outcome, "
                              f"{spec.min_tasks} needed in each", control_tasks=nc, treated_tasks=nt), 0.0  # fmt: skip
    threshold = 2 / spec.alpha
    pc, vc = control.rate()
    pt, vt = treated.rate()
    d = pc - pt - spec.max_success_drop
    tau = max(spec.max_success_drop, 0.01)
    success_lr = msprt(d, vc + vt, tau * tau)
    evidence = success_lr if d > 0 else 0.0
    if d > 0 and success_lr >= threshold:
        return Verdict(True, f"success {pt:.1%} treated vs {pc:.1%} control: more than "
                             f"{spec.max_success_drop:.1%} worse (mSPRT Λ={success_lr:.3g} ≥ {threshold:g})",
                       success_lr, None, nc, nt), evidence  # fmt: skip
    cost_lr = None
    # What no rollback rests on, with the arms' figures: a bare "no significant harm" was all it
    # said while control completed 66% of tasks and the treated arm 37%, not yet significant.
    said = [_short("success", f"{pt:.1%} treated vs {pc:.1%} control", d, success_lr, threshold,
                   f"{spec.max_success_drop:.1%} worse")]  # fmt: skip
    rc, rt = control.cost_per_completed(), treated.cost_per_completed()
    if rc is not None and rt is not None and rc[0] > 0 and rt[0] > 0:
        margin = math.log1p(spec.max_cost_per_completed_increase)
        d_cost = math.log(rt[0] / rc[0]) - margin
        var = rc[1] / rc[0] ** 2 + rt[1] / rt[0] ** 2
        tau_cost = max(margin, 0.05)
        cost_lr = msprt(d_cost, var, tau_cost * tau_cost)
        if d_cost > 0:
            evidence = max(evidence, cost_lr)
        if d_cost > 0 and cost_lr >= threshold:
            return Verdict(True, f"cost per completed task ${rt[0]:.5f} treated vs ${rc[0]:.5f} control: more "
                                 f"than {spec.max_cost_per_completed_increase:.0%} higher "
                                 f"(mSPRT Λ={cost_lr:.3g} ≥ {threshold:g})", success_lr, cost_lr, nc, nt), evidence  # fmt: skip
        said.append(_short("cost per completed task", f"${rt[0]:.5f} treated vs ${rc[0]:.5f} control", d_cost,
                           cost_lr, threshold, f"{spec.max_cost_per_completed_increase:.0%} higher"))  # fmt: skip
    return Verdict(False, "no significant harm: " + "; ".join(said), success_lr, cost_lr, nc, nt), evidence


def _short(what: str, figures: str, d: float, lr: float, threshold: float, beyond: str) -> str:
    """One test that found no harm: within the tolerance, or beyond it without the evidence yet."""
    if d <= 0:
        return f"{what} {figures}, within the tolerance"
    return f"{what} {figures}: more than {beyond}, not yet significant (mSPRT Λ={lr:.3g} < {threshold:g})"


def _by_key(a: ArmTasks) -> dict[str | None, Moments]:
    keys = a.keys if len(a.keys) == a.n else [None] * a.n
    tasks: dict[str | None, tuple[list[float], list[float]]] = {}
    for key, y, x in zip(keys, a.success, a.cost, strict=True):
        ys, xs = tasks.setdefault(key, ([], []))
        ys.append(y)
        xs.append(x)
    return {k: Moments.of(ys, xs) for k, (ys, xs) in tasks.items()}


def judge(control: ArmTasks, treated: ArmTasks, spec: GuardSpec) -> Verdict:
    """Harm, and a rollback only if it is not the doing of a few virtual keys.

    Any key can post outcomes for its own tasks (true or not), and any key can steer its tasks
    into the treated arm (the arm is a public hash of the task id). So when the test finds harm,
    it is run again without the keys that push hardest for it: ``ceil(spec.key_share × K)`` of the
    K virtual keys with outcomes (at least one), left out one at a time, each time the key whose
    removal weakens the evidence most. Only if harm is still found (with ``min_tasks`` in each arm
    left) does the guard roll back. Tasks of the master key (and of open mode) are the operator's
    and are never left out."""
    c_keys, t_keys = _by_key(control), _by_key(treated)
    c_all, t_all = sum(c_keys.values(), Moments()), sum(t_keys.values(), Moments())
    verdict, _ = _test(c_all, t_all, spec)
    keys = {k for k in (*c_keys, *t_keys) if k is not None}
    if not verdict.worse or not keys:
        return verdict
    drop = min(len(keys), max(1, math.ceil(spec.key_share * len(keys))))
    kept = (c_all, t_all)

    def without(k: str, arms: tuple[Moments, Moments]) -> tuple[Moments, Moments]:
        return arms[0] - c_keys.get(k, Moments()), arms[1] - t_keys.get(k, Moments())

    for _ in range(drop):
        now = kept
        key = min(sorted(keys), key=lambda k: _test(*without(k, now), spec)[1])
        keys.discard(key)
        kept = without(key, kept)
    robust, _ = _test(*kept, spec)
    if robust.worse:
        return dataclasses.replace(verdict, reason=f"{verdict.reason}; still so without the {drop} "
                                   f"virtual key(s) that weigh most for it", keys_left_out=drop)  # fmt: skip
    return dataclasses.replace(
        robust, reason=f"no rollback: without the {drop} virtual key(s) that weigh most for it "
                       f"({verdict.reason.split(':')[0]} harm), {robust.reason}", keys_left_out=drop,
    )  # fmt: skip


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

    async def check(self, rt: ActivePolicy) -> Verdict | None:
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
        self,
        tally: TaskTally,
        requests: Sequence[RequestRecord],
        outcomes: Sequence[OutcomeRecord],
        spec: GuardSpec,
    ) -> Verdict:
        tally.add(requests)
        self._cursor = max([self._cursor, *(r.ts for r in requests)])
        tally.forget_before(self._cursor - READ_OVERLAP_S)
        arms = tally.arms(outcomes)
        return judge(arms.get(CONTROL, ArmTasks()), arms.get(TREATED, ArmTasks()), spec)

    def _tally_for(self, rt: ActivePolicy) -> TaskTally:
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

    async def run(self, current: Callable[[], ActivePolicy]) -> None:
        while True:
            spec = current().policy.spec.guard
            await asyncio.sleep(spec.check_every_s if spec is not None else 60.0)
            try:
                await self.check(current())
            except Exception:
                log.exception("policy guard check failed; trying again at the next interval")
