"""Admission: per-key rate limits and budgets (per key, per task), before a backend is called.

Budgets reserve the decision's estimated cost atomically across every scope (the key's and the
task's) before the call and settle the actual cost after it, so concurrent requests — on one
replica or many, through ``router.shared`` — cannot overspend by more than what is in flight.
Rate limits are a sliding window of requests and tokens per key. A budget store that cannot be
reached refuses the request (503): money is not spent blind. Rate limits fall back to local
counts instead (the state layer counts each such fail-open).

A settle that cannot reach the budget store is kept and retried until it lands (each lands once:
the store drops a repeat), and no new reservation is made before the kept ones have landed, so
what was spent while the store was away is counted before anything more is admitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from router.errors import PayloadTooLarge, RateLimited
from router.features.task.context import least
from router.http.auth import Principal
from router.policy.decide import Decision
from router.shared import (
    BudgetExceeded,
    Budgets,
    MemoryState,
    RateLimits,
    Reservation,
    SharedState,
    StateUnavailable,
)
from router.shared.memory import MemoryBudgets
from router.shared.types import to_nano
from router.store import Store
from router.store.writer import LogWriter

log = logging.getLogger("router.http.admission")


class Admission:
    """``log``: where in-process budgets recall a scope's spend from (None with Redis, which keeps
    it); ``retry_s``: how often settles that could not land are tried again."""

    def __init__(
        self, limits: RateLimits, budgets: Budgets, log: Store | None = None, *, retry_s: float = 1.0
    ) -> None:
        self.limits = limits
        self.budgets = budgets
        self.log = log
        self.retry_s = retry_s
        #: Settles that have not landed yet, by reservation id: (the reservation, its actual cost).
        self._unsettled: dict[str, tuple[Reservation, float]] = {}
        self._retrying = False

    @property
    def unsettled_usd(self) -> float:
        """Spend not yet counted in the budgets (settles waiting for the budget store)."""
        return sum(usd for _, usd in self._unsettled.values())

    async def key_budget_left(self, principal: Principal) -> float | None:
        """What the caller's key may still spend, after the money its requests in flight hold (None:
        no key budget, or the budget store cannot say: then ``admit`` refuses, 503). The decision
        reads it so that it picks, and explores, only among the candidates that fit."""
        if not principal.key_id or principal.budget_usd is None:
            return None
        try:
            if self._unsettled:
                await self.land_unsettled()
            # Never recalled from the log (``recall_spend``): a key's scope is never forgotten.
            used = await self.budgets.spent(f"key:{principal.key_id}")
        except StateUnavailable:
            return None
        return max(0.0, principal.budget_usd - used.spent - used.reserved)

    async def admit(
        self, principal: Principal, task_id: str | None, decision: Decision, task_budget: float | None
    ) -> Reservation | None:
        """Check the key's rate limits and hold the decision's estimated cost in every budget that
        applies (``limit_rate``, then ``hold``)."""
        await self.limit_rate(principal, decision)
        return await self.hold(principal, task_id, decision, task_budget)

    async def limit_rate(self, principal: Principal, decision: Decision) -> int:
        """Count the request against its key's rate limits, or refuse it (429; 413 when its
        estimate alone exceeds the key's tokens per minute). Returns the tokens counted against
        ``--tpm`` (0 without one): the decision's estimate, which ``recount`` replaces by what the
        call used once it has ended."""
        if not (principal.key_id and (principal.rpm or principal.tpm)):
            return 0
        est = decision.estimate(decision.chosen) if principal.tpm else None
        tokens = (est.prompt_tokens + est.output_tokens) if est else 0
        verdict = await self.limits.check_and_consume(
            principal.key_id, tokens=tokens, rpm=principal.rpm, tpm=principal.tpm
        )
        if not verdict and verdict.reason == "too_large":
            # Waiting cannot help a request that alone exceeds the limit: say so, never "retry later".
            raise PayloadTooLarge(
                f"this request's estimated {tokens} tokens exceed this key's tokens-per-minute limit "
                f"of {principal.tpm}: shorten the request or raise the key's limit"
            )
        if not verdict:
            raise RateLimited(
                f"this key's {verdict.reason} limit is reached",
                retry_after=min(verdict.retry_after_s, 3600.0),
            )
        return tokens

    async def recount(self, key_id: str, counted: int, used: int) -> None:
        """Replace the ``counted`` tokens of a request that has ended by the ``used`` ones in its
        key's tokens per minute. Counted at the estimate alone, a key limited to 5,000 tokens a
        minute was served 25,576 in one, in replies far longer than expected; a call that used
        less than its estimate (or none: refused, failed) gives the rest back."""
        if used != counted:
            await self.limits.adjust(key_id, used - counted)

    async def hold(
        self, principal: Principal, task_id: str | None, decision: Decision, task_budget: float | None
    ) -> Reservation | None:
        """Hold the decision's estimated cost in every budget that applies (``task_budget``: the
        policy's per-task limit, from the request's runtime; a scope that decided the request may
        set a lower one, ``Decision.task_budget``), and in each, in the same step, more: up to
        what the request may cost at most (``worst_of``), as much as the budget has room for then
        (``Budgets.reserve``'s ``upto``).

        The worst case is held with the rest, not after it: held apart, the first requests near a
        budget's end each held their one try and were then refused their worst case, or were
        admitted without it and refused the money a given-up try cost in the middle, none served
        (``test_money.py``). It was as much as the key had left when read, before the decision:
        two requests at once each read the whole budget, and the second, wanting the first's
        worst case again, was refused where its hold fitted (``test_admission.py``). It was held
        in the key's budget alone, and a task's starved as the key's had: requests of one task at
        once each paid a given-up try and were refused the next, the others holding the rest."""
        limits = _limits(principal, task_id, decision, task_budget)
        if not limits:
            return None
        amount = hold_of(decision)
        upto = dict.fromkeys(limits, worst_of(decision) - amount)
        if self._unsettled:
            await self.land_unsettled()  # StateUnavailable (a 503) while they cannot land
        if self.log is not None and isinstance(self.budgets, MemoryBudgets):
            await recall_spend(self.budgets, self.log, limits)
        try:
            return await self.budgets.reserve(list(limits), amount, limits, upto=upto)
        except BudgetExceeded as exc:
            raise refusal(exc) from None

    async def hold_billed(
        self, principal: Principal, task_id: str | None, decision: Decision, task_budget: float | None,
        owed: float, held: Reservation | None, more: Iterable[Reservation],
    ) -> Reservation | None:  # fmt: skip
        """Before a request's next try, hold ``owed`` (what its tries so far were billed without
        serving: ``Execution.hold_billed``) in each budget ``hold`` held it in (``held``), where
        it does not hold that much already beyond the serving try's hold: the given-up try its
        worst case counts (``given_up_of``) of what ``hold`` held there on top, and what this
        held before (``more``). Refused as ``admit`` is.

        A given-up try's cost was always held anew: near a key budget's end the requests in flight
        held the rest, and each was refused its next try after paying for one."""
        if held is None:  # ``hold`` held nothing: no budget applies
            return None
        limits = _limits(principal, task_id, decision, task_budget)
        more = list(more)
        short: dict[str, float] = {}
        for scope in limits:
            covered = sum(r.held_in(scope) for r in more) + min(
                held.more.get(scope, 0.0), given_up_of(decision)
            )
            if to_nano(owed) > to_nano(covered):
                short[scope] = owed - covered
        if not short:
            return None
        try:
            return await self.budgets.reserve(list(short), 0.0, limits, more=short)
        except BudgetExceeded as exc:
            raise refusal(exc) from None

    async def keep(self, holds: Callable[[], Iterable[Reservation | None]]) -> None:
        """Renew a running request's holds (``holds()``, read again each time: more are made as
        it runs) every half of their lifetime, until they are all closed or this is cancelled at
        the request's end. Holds lapse after ``reservation_ttl_s`` so that a crashed replica's free
        themselves; a stream that ran longer lost its hold while it ran, and the money it held
        was spent again by others (``test_long_holds.py``).

        A renewal that cannot reach the store is tried again every ``retry_s`` until it lands. It
        was tried again at the next half lifetime, when its hold had just lapsed: a Redis outage
        of a second at a renewal lost the hold of every request then running (the hold lapses,
        as it would have, if none lands before)."""
        while live := [r for r in holds() if r is not None and not r.closed]:
            await asyncio.sleep(min(r.ttl_s for r in live) / 2)
            retrying = False
            while not await self._renew(holds(), retrying):
                retrying = True
                await asyncio.sleep(self.retry_s)

    async def _renew(self, holds: Iterable[Reservation | None], retrying: bool) -> bool:
        """Renew each open hold; False when one could not reach the store (said once a turn)."""
        landed = True
        for reservation in holds:
            if reservation is None or reservation.closed:
                continue
            try:
                await self.budgets.extend(reservation)
            except StateUnavailable as exc:
                if not retrying:
                    log.warning("budget hold %s not renewed (%s): tried again every %g s",
                                reservation.id, exc.reason, self.retry_s)  # fmt: skip
                landed = False
        return landed

    async def settle(self, reservation: Reservation, actual_usd: float | None) -> None:
        """Turn the hold into spend (a failed request spends what it used, usually nothing). When
        the budget store cannot be reached the settle is kept and retried until it lands."""
        usd = actual_usd or 0.0
        try:
            await self.budgets.settle(reservation, usd)
        except StateUnavailable as exc:
            log.warning("budget settle of reservation %s deferred (%s): retried until it lands",
                        reservation.id, exc.reason)  # fmt: skip
            self._unsettled[reservation.id] = (reservation, usd)
            if not self._retrying:
                await self._retry()

    async def land_unsettled(self) -> None:
        """Settle what could not be settled before; raises ``StateUnavailable`` if it still cannot."""
        for rid, (reservation, usd) in list(self._unsettled.items()):
            await self.budgets.settle(reservation, usd)
            self._unsettled.pop(rid, None)

    async def _retry(self) -> None:
        """One loop per process (in the settle task that found the store away) until all have landed."""
        self._retrying = True
        try:
            while self._unsettled:
                await asyncio.sleep(self.retry_s)
                try:
                    await self.land_unsettled()
                except StateUnavailable:
                    continue
            log.warning("budget settles deferred by the budget store's outage have all landed")
        except asyncio.CancelledError:
            # Shutting down with the store still away: the log keeps these costs, the budgets not.
            if self._unsettled:
                log.error("%d budget settles ($%.6f) never reached the budget store before shutdown",
                          len(self._unsettled), self.unsettled_usd)  # fmt: skip
            raise
        finally:
            self._retrying = False


def _limits(
    principal: Principal, task_id: str | None, decision: Decision, task_budget: float | None
) -> dict[str, float]:
    """The budgets a request is held in, by scope: its key's, and its task's (``task_budget``,
    the policy's, or a lower one of the scope that decided)."""
    limits: dict[str, float] = {}
    if principal.key_id and principal.budget_usd is not None:
        limits[f"key:{principal.key_id}"] = principal.budget_usd
    task_budget = least(task_budget, decision.task_budget)
    if task_budget is not None and task_id:
        limits[f"task:{task_id}"] = task_budget
    return limits


def hold_of(decision: Decision) -> float:
    """What a request holds of its budgets: the cost at the 90th percentile of the backend's output,
    not the mean (a budget's last requests in flight could otherwise together spend past it), on
    the dearest backend it may be served by. The chosen one's alone was held before: when it
    failed, requests in flight all fell back to a dearer one, 40 at once spending $0.1146 of a
    key's $0.05 (``test_money.py``). The decision leaves out the candidates that do not fit."""
    held = 0.0
    for model in decision.order:
        est = decision.estimate(model)
        if est is not None:
            held = max(held, est.hold_usd if est.hold_usd is not None else est.cost_usd)
    return held


def worst_of(decision: Decision) -> float:
    """What a request may cost at most: ``Estimate.worst_usd`` (the rest of the output its backend
    may write, the most calls of its hosted tools) on the dearest backend it may be served by,
    and one try given up before it (``given_up_of``).

    The 90th percentile alone was held, and a reply may be as long as its backend allows: 40
    requests at once on a key with $0.10, each writing ~3,200 tokens where 1,024 were expected,
    spent $0.287 (``test_money.py``); and the hosted tools' calls past the one held were left
    out. A request holds this much of what its key has left, so that near a budget's end the
    requests in flight can pay for what they may write, and for a try that timed out before the
    one that serves (``Admission.hold_billed``); a key with room to spare runs as many at once as
    before."""
    worst = 0.0
    for model in decision.order:
        est = decision.estimate(model)
        if est is not None:
            held = est.hold_usd if est.hold_usd is not None else est.cost_usd
            worst = max(worst, held, est.worst_usd or 0.0)
    return worst + given_up_of(decision)


def given_up_of(decision: Decision) -> float:
    """What a try given up by a timeout may be billed, on the dearest backend the request may try:
    its estimate, as ``accounting.given_up`` charges one (a stream of a model that does not
    reason, given up before its first token, is charged its prompt alone: less)."""
    return max((e.cost_usd for m in decision.order if (e := decision.estimate(m)) is not None), default=0.0)


#: What a client refused for money held by requests in flight is told to wait: they settle in
#: seconds, usually for less than they held.
HELD_RETRY_AFTER_S = 1.0


def refusal(exc: BudgetExceeded) -> RateLimited | BudgetExceeded:
    """A 403 only when the spend itself leaves no room for this request: when it is the holds of
    requests in flight that do, the money may come back, so it is a 429 with Retry-After."""
    if exc.spent_usd + exc.amount_usd <= exc.limit_usd:
        err = RateLimited(
            f"budget for {exc.scope} is held by requests in flight (limit ${exc.limit_usd:.4f}, "
            f"spent ${exc.spent_usd:.4f}, held ${exc.reserved_usd:.4f}); retry shortly",
            retry_after=HELD_RETRY_AFTER_S,
        )
        err.code = "budget_held"
        return err
    return exc


_COLUMN = {"key": "key_id", "task": "task_id"}


async def recall_spend(budgets: MemoryBudgets, store: Store, scopes: Iterable[str]) -> None:
    """In-process budgets keep the most recent task scopes (``StateConfig.local_max_entries``);
    one dropped for room, or seen for the first time since, starts again from the log. Keys'
    scopes are never dropped (the start restored them all), so never looked up."""
    for scope in scopes:
        if budgets.forgotten(scope):
            kind, _, value = scope.partition(":")
            usd = await store.spend_of(_COLUMN[kind], value, budgets.active_since())
            if budgets.forgotten(scope):  # not restored by a concurrent request meanwhile
                budgets.restore({scope: usd})


async def restore_spend(
    state: SharedState, store: Store, task_budgets: bool, writer: LogWriter | None = None
) -> int:
    """Budgets start from the spend in the log when their counts are lost, so that neither a
    restart of the router (in-process budgets: restored here, now) nor of Redis without its data
    (restored by the state layer when it finds the counts gone) resets them.

    Keys' budgets last (``router.shared.memory.lasting``): their whole spend in the log is read
    back; tasks', of those used in the last ``budget_idle_ttl_s``, as the budgets forget others.
    Returns the number of scopes restored now (0 with Redis, which restores when it must).

    ``writer``: this process's log writer, whose buffer is stored before the log is read (a store
    that cannot take it fails the restore: the budgets answer 503 until it can).
    """

    async def logged(since: float) -> Mapping[str, float]:
        if writer is not None:
            # Redis back empty after the store too was away: the requests answered meanwhile were
            # settled in the Redis that was lost and are still in the buffer, so a log read
            # without them forgot their spend (test_replicas.py).
            await writer.flush()
        # A key's whole spend, however long ago its last request (one query, summed per key, as
        # the tasks' below): a key quiet for 40 days got its budget back at a restart.
        spent = {f"key:{k}": usd for k, usd in (await store.spend_by("key_id", 0.0)).items()}
        if task_budgets:
            spent.update({f"task:{t}": usd for t, usd in (await store.spend_by("task_id", since)).items()})
        return spent

    if not isinstance(state, MemoryState):
        state.budgets.restore_from(logged)
        return 0
    spent = await logged(state.budgets.active_since())
    state.budgets.restore(spent)
    return len(spent)
