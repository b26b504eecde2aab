"""Admission's numbers, each by hand (``router.http.admission``): what a key has left for the
decision, the scopes a request is held in, a request's worst case over its backends, a given-up
try held when the request's admission had no room for one, and the budget store's outages (kept
settles land once it is back, in one loop per process; a renewal that fails is said once).

Written for the mutants that survived ``python -m tests.mutation admission`` (docs/development.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import pytest
import redis

from router.errors import RateLimited
from router.http import admission
from router.http.admission import Admission
from router.http.auth import Principal
from router.policy.decide import Decision, Estimate
from router.shared import (
    BudgetExceeded,
    MemoryState,
    Reservation,
    Spend,
    StateConfig,
    StateUnavailable,
    open_state,
)
from tests.integration.tcpproxy import TcpProxy
from tests.polling import eventually
from tests.unit.requestpath import closed_port

REDIS_PORT = 6379


def one(task_budget: float | None = None) -> Decision:
    """A decision for backend "a": a hold of $0.004, a given-up try of $0.001 (100 + 50 tokens)."""
    est = Estimate("a", 100, 50, 0, 0.001, hold_usd=0.004)
    return Decision("d", "p", ["a"], [est], "why", task_budget=task_budget)


async def test_what_a_key_has_left_is_its_budget_less_its_spend_and_what_its_requests_hold() -> None:
    """The decision picks among the candidates that fit this (``key_budget_left``): a key's
    budget, less what it spent and what its requests in flight hold, never below nothing; None
    for a key without a budget (every candidate fits)."""
    state = MemoryState()
    gate = Admission(state.limits, state.budgets)
    who = Principal(key_id="k", name="agent", budget_usd=0.01)
    assert await gate.key_budget_left(who) == pytest.approx(0.01)
    flying = await state.budgets.reserve(["key:k"], 0.003, {"key:k": 0.01})
    done = await state.budgets.reserve(["key:k"], 0.001, {"key:k": 0.01})
    await state.budgets.settle(done, 0.002)
    assert await gate.key_budget_left(who) == pytest.approx(0.005)
    await state.budgets.settle(flying, 0.012)  # a reply far longer than held: spent past the budget
    assert await gate.key_budget_left(who) == 0.0
    assert await gate.key_budget_left(Principal(key_id="k", name="agent")) is None
    assert await gate.key_budget_left(Principal(key_id=None, name="open")) is None


async def test_a_key_without_limits_counts_no_tokens() -> None:
    """``limit_rate`` returns what it counted against ``--tpm``, which the request's end replaces
    by what it used: none for a key without limits, nor for one with a requests limit alone."""
    state = MemoryState()
    gate = Admission(state.limits, state.budgets)
    assert await gate.limit_rate(Principal(key_id="k", name="agent"), one()) == 0
    assert await gate.limit_rate(Principal(key_id="k", name="agent", rpm=5), one()) == 0
    assert await gate.limit_rate(Principal(key_id="k", name="agent", tpm=500), one()) == 150


@pytest.mark.parametrize(("policy", "scope"), [(None, 0.003), (0.003, None), (1.0, 0.003), (0.003, 1.0)])
async def test_a_task_is_held_within_the_lower_of_the_policys_and_its_scopes_budget(
    policy: float | None, scope: float | None
) -> None:
    """A scope that decided a request may set a lower per-task budget than the policy's
    (``Decision.task_budget``): the task is held within the lower of the two, here too low for
    the request's hold of $0.004."""
    state = MemoryState()
    gate = Admission(state.limits, state.budgets)
    with pytest.raises(BudgetExceeded) as refused:
        await gate.admit(Principal(key_id=None, name="open"), "t", one(task_budget=scope), policy)
    assert refused.value.scope == "task:t" and refused.value.limit_usd == 0.003
    roomy = await gate.admit(Principal(key_id=None, name="open"), "t", one(task_budget=0.01), 1.0)
    assert roomy is not None and roomy.scopes == ("task:t",)
    assert roomy.held_in("task:t") == pytest.approx(0.005)  # its hold and a given-up try


def test_the_worst_case_is_the_dearest_backends_whoever_comes_first() -> None:
    """A request may be served by any backend of its order: it may cost at most the dearest one's
    worst case (its whole output), and a try given up before it (the dearest expected cost)."""
    dear = Estimate("dear", 100, 50, 0, 0.002, hold_usd=0.004, worst_usd=0.009)
    cheap = Estimate("cheap", 100, 50, 0, 0.001, hold_usd=0.002, worst_usd=0.003)
    unbounded = Estimate("nocap", 100, 50, 0, 0.0005, hold_usd=0.006)  # no worst case known: its hold
    for order in (["dear", "cheap"], ["cheap", "dear"]):
        decision = Decision("d", "p", order, [dear, cheap], "why")
        assert admission.worst_of(decision) == pytest.approx(0.009 + 0.002)
    decision = Decision("d", "p", ["dear", "nocap"], [dear, unbounded], "why")
    assert admission.worst_of(decision) == pytest.approx(0.009 + 0.002)
    decision = Decision("d", "p", ["nocap", "cheap"], [unbounded, cheap], "why")
    assert admission.worst_of(decision) == pytest.approx(0.006 + 0.001)


async def test_a_request_admitted_without_room_for_a_given_up_try_holds_it_when_billed() -> None:
    """A request admitted at a budget's end holds its hold alone (no room for a given-up try).
    A try it gives up is billed: it holds that on top before its next, refused while the others
    hold the rest, held once they have settled; none of it was counted as held already."""
    state = MemoryState()
    gate = Admission(state.limits, state.budgets)
    who = Principal(key_id="k", name="agent", budget_usd=0.01)
    other = await state.budgets.reserve(["key:k"], 0.006, {"key:k": 0.01})
    held = await gate.admit(who, None, one(), None)
    assert held is not None and held.more == {} and held.held_in("key:k") == pytest.approx(0.004)
    with pytest.raises(RateLimited):
        await gate.hold_billed(who, None, one(), None, 0.001, held, [])
    await state.budgets.settle(other, 0.002)
    billed = await gate.hold_billed(who, None, one(), None, 0.001, held, [])
    assert billed is not None and billed.held_in("key:k") == pytest.approx(0.001)
    assert await state.budgets.spent("key:k") == Spend(pytest.approx(0.002), pytest.approx(0.005))


async def test_a_renewal_that_cannot_reach_the_store_is_said_once_naming_the_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Renewals are tried again every ``retry_s`` while the store is away: the operator is told
    once which hold was not renewed and why, not once a retry."""
    state = open_state(f"redis://127.0.0.1:{closed_port()}/0")
    held = Reservation(id="res-away", scopes=("key:k",), amount_usd=0.01, expires_at=0.0, ttl_s=0.1)
    gate = Admission(state.limits, state.budgets, retry_s=0.02)
    with caplog.at_level(logging.WARNING, logger="router.http.admission"):
        keeping = asyncio.create_task(gate.keep(lambda: [held]))
        await asyncio.sleep(0.4)  # its first renewal at 0.05 s, then retried every 0.02 s
        assert not keeping.done()
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
    await state.aclose()
    said = [r.getMessage() for r in caplog.records if r.name == "router.http.admission"]
    assert len(said) == 1, said
    assert said[0].startswith("budget hold res-away not renewed (") and "(None)" not in said[0]


@pytest.mark.integration
async def test_settles_kept_through_outages_land_when_the_store_is_back_in_one_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Settles that cannot reach Redis are kept and retried by one loop (in the settle that first
    found it away: the others' tasks end at once), which ends once they have all landed, each
    once, however many land them at once; the next outage starts another. Two outages, two
    requests' settles in each."""
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    proxy = TcpProxy(REDIS_PORT).start()
    config = StateConfig(prefix=prefix, op_timeout_s=0.3, socket_timeout_s=0.2,
                         connect_timeout_s=0.2, pool_timeout_s=0.2, backoff_s=0.1)  # fmt: skip
    state = open_state(f"redis://127.0.0.1:{proxy.port}/0", config)
    gate = Admission(state.limits, state.budgets, retry_s=0.5)

    async def kept() -> bool:
        return gate.unsettled_usd > 0

    async def answers() -> bool:
        try:
            await state.budgets.spent("key:other")
        except StateUnavailable:
            return False
        return True

    try:
        with caplog.at_level(logging.WARNING, logger="router.http.admission"):
            for outage in (1, 2):
                first, second = [await state.budgets.reserve(["key:k"], 0.01, {"key:k": 1.0}) for _ in "ab"]
                proxy.stop()
                landing = asyncio.create_task(gate.settle(first, 0.004))
                await eventually(kept, what="the first settle kept")
                await asyncio.wait_for(gate.settle(second, 0.002), 2.0)  # kept for the first's loop
                assert not landing.done() and gate.unsettled_usd == pytest.approx(0.006)
                proxy.start()
                await eventually(answers, what="Redis answering again")
                # Requests' admissions land them too, at once: each lands once.
                await asyncio.gather(gate.land_unsettled(), gate.land_unsettled())
                await asyncio.wait_for(landing, 5.0)
                assert gate.unsettled_usd == 0
                assert await state.budgets.spent("key:k") == Spend(pytest.approx(0.006 * outage), 0.0)
    finally:
        proxy.stop()
        await state.aclose()
        with redis.Redis(port=REDIS_PORT) as r:
            if keys := list(r.scan_iter(match=prefix + "*", count=1000)):
                r.delete(*keys)
    said = [r.getMessage() for r in caplog.records if r.name == "router.http.admission"]
    assert said.count("budget settles deferred by the budget store's outage have all landed") == 2, said
