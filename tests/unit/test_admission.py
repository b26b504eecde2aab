"""Admission (router.http.admission) through the in-process router: per-key RPM/TPM limits, per-key and
per-task budgets, and settlement with the real cost of the call.

Prices in these policies are $1/M input and $2/M output tokens, so a request's cost can be worked
out from its logged token counts by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from router.errors import RateLimited
from router.fakeupstream import FakeUpstream
from router.forward.timeouts import Timeouts
from router.http import admission
from router.http.admission import Admission
from router.http.auth import Principal
from router.policy.decide import Decision, Estimate
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from router.shared import BudgetExceeded, MemoryState, Reservation, Spend, StateConfig, open_state
from router.store import RequestRecord, open_store
from tests.polling import eventually
from tests.unit.inprocess import MASTER, Router, serving
from tests.unit.requestpath import BODIES, called, closed_port, model

#: Small enough that a short prompt plus this many output tokens is ~110 estimated tokens.
MAX_TOKENS = 100


def hand_cost(row: RequestRecord) -> float:
    return row.input_tokens * 1e-6 + row.output_tokens * 2e-6


async def spend_once(r: Router) -> tuple[dict[str, Any], str]:
    """One request on a new key with room to spare, settled: its log row and the key's id."""
    key, key_id = await r.key(budget_usd=1.0)
    await r.post(key=key, max_tokens=MAX_TOKENS)
    await settled(r, f"key:{key_id}")
    rows = await r.records()
    return rows[-1], key_id


async def settled(r: Router, scope: str) -> Any:
    """The scope's usage once no reservation is outstanding (settling runs after the reply)."""

    async def done() -> Any:
        usage = await r.s.state.budgets.spent(scope)
        return usage if usage.reserved == 0 else None

    return await eventually(done, what=f"settlement of {scope}")


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
async def test_rpm_limit_refuses_in_the_protocols_shape(
    fake: FakeUpstream, tmp_path: Path, protocol: str
) -> None:
    async with serving(tmp_path, [model("a", fake.url, protocol="openai")], master_key=MASTER) as r:
        key, key_id = await r.key(rpm=2)
        answers = [await r.post(protocol, key=key) for _ in range(3)]
        rows = await r.records()
        served = called(fake, r.s.runtime.current.catalog)
    assert [a.status_code for a in answers] == [200, 200, 429]
    refused = answers[2]
    body = refused.json()
    kind = body["error"]["type"]
    assert kind == "rate_limit_error"
    if protocol == ANTHROPIC:
        assert body["type"] == "error"
    assert "rpm limit" in body["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert served == ["a", "a"]  # the refused request never reached the provider
    assert [row.status for row in rows] == [200, 200, 429]
    assert {row.key_id for row in rows} == {key_id}


async def test_rpm_is_counted_per_key(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        first, _ = await r.key(rpm=1)
        second, _ = await r.key(rpm=1)
        unlimited, _ = await r.key()
        statuses = [
            (await r.post(key=k)).status_code for k in (first, second, first, second, unlimited, unlimited)
        ]
    assert statuses == [200, 200, 429, 429, 200, 200]


async def test_tpm_limit_counts_what_calls_used_not_their_estimates(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        key, key_id = await r.key(tpm=250, budget_usd=1.0)
        answers = []
        for _ in range(3):
            answers.append(await r.post(key=key, max_tokens=MAX_TOKENS))
            await settled(r, f"key:{key_id}")  # the request has ended: its count is corrected
        rows = await r.records()
    # ~110 tokens estimated each: the third would not fit in 250 beside two such estimates, but
    # the calls used far fewer (a short reply), and what they used is what counts once they end.
    assert all(100 < row.prompt_tokens_est + MAX_TOKENS < 125 for row in rows)
    assert sum(row.input_tokens + row.output_tokens for row in rows) < 250 / 2
    assert [a.status_code for a in answers] == [200, 200, 200]


async def test_request_larger_than_the_tpm_limit_is_refused(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        key, _ = await r.key(tpm=50)
        answer = await r.post(key=key, max_tokens=MAX_TOKENS)
        served = called(fake, r.s.runtime.current.catalog)
    # Waiting cannot help: a 413 that says why, not a 429 telling the client to retry.
    assert answer.status_code == 413 and "retry-after" not in answer.headers
    assert "exceed this key's tokens-per-minute limit of 50" in answer.json()["error"]["message"]
    assert served == []


async def test_settlement_spends_the_real_cost_not_the_estimate(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=1.0)
        assert (await r.post(key=key, max_tokens=MAX_TOKENS)).status_code == 200
        usage = await settled(r, f"key:{key_id}")
        (row,) = await r.records()
    assert row.cost_usd == pytest.approx(hand_cost(row), abs=1e-12)
    assert usage.spent == pytest.approx(row.cost_usd, abs=1e-9)
    # The hold was the estimate (100 output tokens); the reply was far shorter.
    assert row.cost_est_usd > 2 * row.cost_usd


async def test_budget_refuses_a_request_that_could_overspend(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=1e-5)  # less than one request's estimate
        answer = await r.post(ANTHROPIC, key=key, max_tokens=MAX_TOKENS)
        usage = await r.s.state.budgets.spent(f"key:{key_id}")
        served = called(fake, r.s.runtime.current.catalog)
    assert answer.status_code == 403
    assert answer.json()["error"]["type"] == "permission_error"
    assert f"key:{key_id}" in answer.json()["error"]["message"]
    assert served == [] and usage.spent == 0 and usage.reserved == 0


async def test_budget_counts_what_was_really_spent(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        row, _ = await spend_once(r)
        estimate, cost = row.cost_est_usd, row.cost_usd
        # Room for one estimate plus half a real cost: the second identical request must not fit.
        key, key_id = await r.key(budget_usd=estimate + cost / 2)
        first = await r.post(key=key, max_tokens=MAX_TOKENS)
        await settled(r, f"key:{key_id}")
        second = await r.post(key=key, max_tokens=MAX_TOKENS)
    assert (first.status_code, second.status_code) == (200, 403)


async def test_concurrent_requests_cannot_overspend_together(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url, "ttft_ms=200")], master_key=MASTER) as r:
        row, _ = await spend_once(r)
        key, key_id = await r.key(budget_usd=1.5 * row.cost_est_usd)
        answers = await asyncio.gather(*(r.post(key=key, max_tokens=MAX_TOKENS) for _ in range(2)))
        await settled(r, f"key:{key_id}")
        again = await r.post(key=key, max_tokens=MAX_TOKENS)
    assert sorted(a.status_code for a in answers) == [200, 429]
    held = next(a for a in answers if a.status_code == 429)
    # The money was held, not spent: worth retrying shortly, and the retry fits once the hold settles.
    assert held.json()["error"]["code"] == "budget_held" and held.headers["retry-after"] == "1"
    assert again.status_code == 200


async def test_failed_request_spends_nothing(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url, "status=503")], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=1.0)
        answer = await r.post(key=key, max_tokens=MAX_TOKENS)
        usage = await settled(r, f"key:{key_id}")
    assert answer.status_code == 502
    assert usage.spent == 0


async def test_task_budget_from_the_objective(fake: FakeUpstream, tmp_path: Path) -> None:
    objective = {
        "objective": {"max_cost_per_task": 0.00022}
    }  # one estimate, not an estimate plus a real cost
    async with serving(tmp_path, [model("a", fake.url)], policy=objective) as r:
        task = {"x-router-task-id": "budgeted-task"}
        first = await r.post(headers=task, max_tokens=MAX_TOKENS)
        usage = await settled(r, "task:budgeted-task")
        second = await r.post(headers=task, max_tokens=MAX_TOKENS)
        other = await r.post(headers={"x-router-task-id": "another-task"}, max_tokens=MAX_TOKENS)
        (row, *_) = await r.records()
    assert row.cost_est_usd < 0.00022 < row.cost_est_usd + usage.spent
    assert (first.status_code, second.status_code, other.status_code) == (200, 403, 200)
    assert "task:budgeted-task" in second.json()["error"]["message"]


async def test_a_side_call_within_the_task_budget_is_served_by_a_candidate_it_affords(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # A side call (a short max_tokens: a title, a summary) was held at the dearest candidate's
    # cost, as the decision had not left out those over the task's budget for it: 403 while the
    # cheapest would serve it for a fiftieth of the budget.
    dear = {**model("dear", fake.url), "prices": {"input": 100.0, "output": 200.0}}
    async with serving(
        tmp_path, [model("cheap", fake.url), dear], policy={"objective": {"max_cost_per_task": 0.05}}
    ) as r:
        side = await r.post(headers={"x-router-task-id": "titled"}, max_tokens=1000)
        (row,) = await r.records()
    assert side.status_code == 200, side.text
    assert row.side_call and row.chosen_model == "cheap"


async def test_a_scopes_task_budget_leaves_out_the_candidates_it_cannot_hold(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # The same side call, the budget a scope's: the decision read the policy's budget alone (none),
    # so the dear candidate stayed in the order and admission held it against the scope's budget (403).
    dear = {**model("dear", fake.url), "prices": {"input": 100.0, "output": 200.0}}
    scope = {"name": "acme", "match": {"repo": "acme/*"}, "objective": {"max_cost_per_task": 0.05}}
    async with serving(tmp_path, [model("cheap", fake.url), dear], policy={"scopes": [scope]}) as r:
        headers = {"x-router-task-id": "titled", "x-router-repo": "acme/api"}
        side = await r.post(headers=headers, max_tokens=1000)
        (row,) = await r.records()
    assert side.status_code == 200, side.text
    assert row.side_call and row.chosen_model == "cheap" and "/acme/" in (row.policy or "")


async def test_open_mode_without_limits_holds_nothing(fake: FakeUpstream, tmp_path: Path) -> None:
    async with serving(tmp_path, [model("a", fake.url)]) as r:
        answer = await r.post(max_tokens=MAX_TOKENS)
        (row,) = await r.records()
    assert answer.status_code == 200 and row.key_id is None


async def test_unreachable_state_refuses_budgets_but_not_rate_limits(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """Money is not spent blind (503); rate limits fall back to this replica's own counts."""
    redis_url = f"redis://127.0.0.1:{closed_port()}/0"
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER, redis_url=redis_url) as r:
        budgeted, _ = await r.key(budget_usd=1.0)
        limited, _ = await r.key(rpm=1)
        refused = await r.post(key=budgeted, max_tokens=MAX_TOKENS)
        limited_answers = [(await r.post(key=limited)).status_code for _ in range(2)]
        fail_open = dict(r.s.state.fail_open_counts)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "state_unavailable"
    assert limited_answers == [200, 429]  # the local count still limits
    assert fail_open.get("rate_limits", 0) >= 2


async def test_a_free_model_is_never_refused_by_a_budget(fake: FakeUpstream, tmp_path: Path) -> None:
    free = {**model("local", fake.url), "prices": {"input": 0.0, "output": 0.0}}
    async with serving(tmp_path, [free], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=0.5)
        answers = [(await r.post(key=key, max_tokens=MAX_TOKENS)).status_code for _ in range(3)]
        usage = await settled(r, f"key:{key_id}")
    assert answers == [200, 200, 200] and usage.spent == 0


async def test_a_settle_that_cannot_reach_the_state_is_kept_and_retried(
    fake: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # It was logged and dropped: the hold expired and the spend was never counted (issue 30 #2).
    redis_url = f"redis://127.0.0.1:{closed_port()}/0"
    held = Reservation(id="res-unreachable", scopes=("key:k",), amount_usd=0.01, expires_at=0.0, ttl_s=600.0)
    async with serving(tmp_path, [model("a", fake.url)], redis_url=redis_url) as r:
        adm = admission.Admission(r.s.state.limits, r.s.state.budgets, retry_s=0.05)
        with caplog.at_level(logging.WARNING, logger="router.http.admission"):
            settling = asyncio.create_task(adm.settle(held, 0.004))
            await asyncio.sleep(0.3)
            assert not settling.done() and adm.unsettled_usd == pytest.approx(0.004)
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling
    messages = [rec.getMessage() for rec in caplog.records if rec.name == "router.http.admission"]
    assert messages[0].startswith("budget settle of reservation res-unreachable deferred (")
    assert "(None)" not in messages[0]
    assert messages[-1] == "1 budget settles ($0.004000) never reached the budget store before shutdown"


async def test_shared_budgets_are_not_restored_from_the_log(tmp_path: Path) -> None:
    """Redis keeps its own spend across restarts; only the in-process state starts from the log."""
    shared = open_state(f"redis://127.0.0.1:{closed_port()}/0")
    assert await admission.restore_spend(shared, open_store(f"sqlite:///{tmp_path / 'none.db'}"), True) == 0


async def test_a_restart_keeps_what_each_key_spent(fake: FakeUpstream, tmp_path: Path) -> None:
    """In-process budgets start again from the spend in the log (same store, new process state)."""
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        row, key_id = await spend_once(r)
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as again:
        usage = await again.s.state.budgets.spent(f"key:{key_id}")
        untouched = await again.s.state.budgets.spent("key:never-used")
    assert usage.spent == pytest.approx(row.cost_usd, abs=1e-9) and usage.reserved == 0
    assert untouched.spent == 0


async def test_a_restart_keeps_a_key_idle_past_the_budget_ttl_not_its_task(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """A key's budget lasts however long the key was idle: a restart reads back its whole spend in
    the log (a key quiet for 40 days got its budget back). A task idle that long is forgotten, as
    a running process forgets it."""
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        row, key_id = await spend_once(r)
        idle_s = StateConfig().budget_idle_ttl_s
        later = MemoryState(clock=lambda: row.ts + idle_s + 1.0)
        soon = MemoryState(clock=lambda: row.ts + idle_s - 1.0)
        assert await admission.restore_spend(later, r.s.store, True) == 1  # the key alone
        assert await admission.restore_spend(soon, r.s.store, True) == 2  # the key and the task
    for state in (later, soon):
        assert (await state.budgets.spent(f"key:{key_id}")).spent == pytest.approx(row.cost_usd, abs=1e-9)
    assert (await later.budgets.spent(f"task:{row.task_id}")).spent == 0
    assert (await soon.budgets.spent(f"task:{row.task_id}")).spent == pytest.approx(row.cost_usd, abs=1e-9)


def decision(cost_usd: float) -> Decision:
    """A decision for model "a" whose estimate costs ``cost_usd``."""
    est = Estimate(model="a", prompt_tokens=10, output_tokens=MAX_TOKENS, cached_tokens=0, cost_usd=cost_usd)
    return Decision(decision_id="d", policy="p", order=["a"], candidates=[est], reason="by hand")


async def test_retry_after_is_at_most_an_hour() -> None:
    """A key limited over a long window is told to come back within the hour, not in a day."""
    state = MemoryState(StateConfig(rate_window_s=86400.0))
    daily = Principal(key_id="k", name="agent", rpm=1)
    gate = Admission(state.limits, state.budgets)
    await gate.admit(daily, None, decision(0.0), None)
    with pytest.raises(RateLimited) as refused:
        await gate.admit(daily, None, decision(0.0), None)
    assert refused.value.retry_after == 3600.0


async def test_tokens_per_minute_count_what_calls_used() -> None:
    """A request counts its estimate (110 tokens here) against ``--tpm`` until it ends; then what it
    used replaces it: more keeps the next out, less (or none, a refused call) gives the rest back."""
    state = MemoryState(StateConfig())
    key = Principal(key_id="k", name="agent", tpm=250)
    gate = Admission(state.limits, state.budgets)
    counted = await gate.limit_rate(key, decision(0.0))
    assert counted == 10 + MAX_TOKENS
    await gate.recount("k", counted, 240)  # the call wrote far more than expected
    with pytest.raises(RateLimited):
        await gate.limit_rate(key, decision(0.0))
    await gate.recount("k", counted, 0)  # one that used nothing gives its count back
    assert await gate.limit_rate(key, decision(0.0)) == counted
    assert await gate.limit_rate(Principal(key_id="k", name="agent", rpm=100), decision(0.0)) == 0


def test_a_request_that_fits_once_holds_settle_is_told_to_wait() -> None:
    """Spend plus this request exactly at the limit fits (reserving refuses only above it): a 429."""
    fits = admission.refusal(BudgetExceeded("key:k", 0.75, spent_usd=0.5, reserved_usd=0.25, amount_usd=0.25))
    assert isinstance(fits, RateLimited) and fits.code == "budget_held" and fits.retry_after == 1.0
    never = admission.refusal(BudgetExceeded("key:k", 0.75, spent_usd=0.5, reserved_usd=0.25, amount_usd=0.5))
    assert isinstance(never, BudgetExceeded)


async def test_scopes_forgotten_for_room_start_again_from_the_log(fake: FakeUpstream, tmp_path: Path) -> None:
    """In-process budgets that dropped a task's scope for room look its spend up in the log, once,
    even for two requests at the same time; scopes still held are not looked up again. The key's
    scope, restored at the start, is never dropped (its holds and its spend stay)."""
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=1.0)
        await r.post(key=key, headers={"x-router-task-id": "repo:issue-7"}, max_tokens=MAX_TOKENS)
        (row,) = await r.records()
        task = row.task_id  # the key's namespace, then the client's id: the separator comes twice
        state = MemoryState(StateConfig(local_max_entries=2))
        await admission.restore_spend(state, r.s.store, True)
        for other in ("task:x", "task:y", "task:z"):  # fill the room, so that scopes were dropped
            state.budgets.restore({other: 0.25})
        gate = Admission(state.limits, state.budgets, r.s.store)
        who = Principal(key_id=key_id, name="agent", budget_usd=1.0)
        held = await asyncio.gather(*(gate.admit(who, task, decision(0.001), 1.0) for _ in range(2)))
        recalled = [await state.budgets.spent(s) for s in (f"key:{key_id}", f"task:{task}")]
        for reservation in held:
            assert reservation is not None
            await gate.settle(reservation, 0.0005)
        await gate.admit(who, task, decision(0.001), 1.0)
        after = [await state.budgets.spent(s) for s in (f"key:{key_id}", f"task:{task}")]
    cost = row.cost_usd
    assert cost > 0 and task.endswith("/repo:issue-7")
    # Each holds a given-up try besides each hold (``worst_of``).
    assert [(u.spent, u.reserved) for u in recalled] == [(pytest.approx(cost), pytest.approx(0.004))] * 2
    assert [(u.spent, u.reserved) for u in after] == [(pytest.approx(cost + 0.001), pytest.approx(0.002))] * 2


async def test_a_key_budget_is_never_dropped_for_room_nor_for_idleness() -> None:
    """A key's scope was one entry of the bounded LRU: tasks of other keys pushed it out, and with
    it the money its requests in flight held, so it admitted past its budget; and 40 idle days
    dropped it with its spend. A task's scope still goes for room or after those days."""
    now = [1000.0]
    state = MemoryState(StateConfig(local_max_entries=3), clock=lambda: now[0])
    gate = Admission(state.limits, state.budgets)
    who = Principal(key_id="k", name="agent", budget_usd=0.01)
    first = await gate.admit(who, None, decision(0.006), None)
    assert first is not None
    for i in range(10):  # other tasks, each with its own scope
        await state.budgets.reserve([f"task:t{i}"], 0.001, {f"task:t{i}": 1.0})
    with pytest.raises(RateLimited):  # the first request still holds $0.006 of the $0.01
        await gate.admit(who, None, decision(0.006), None)
    await gate.settle(first, 0.006)
    now[0] += 41 * 86400.0
    with pytest.raises(BudgetExceeded):
        await gate.admit(who, None, decision(0.006), None)
    assert (await state.budgets.spent("key:k")).spent == pytest.approx(0.006)
    assert (await state.budgets.spent("task:t9")) == Spend(0.0, 0.0)  # idle 41 days: forgotten


async def test_a_budget_holds_the_90th_percentile_of_the_cost_not_its_mean() -> None:
    """Issue 33: admission held the mean cost, so the requests a nearly spent budget let in at once
    could together spend past it; it holds the cost at the backend's 90th-percentile output."""
    state = MemoryState()
    adm = Admission(state.limits, state.budgets)
    decision = Decision("d", "p", ["a"], [Estimate("a", 100, 50, 0, 0.001, hold_usd=0.004)], "why")
    principal = Principal(key_id="k", name="k", budget_usd=0.01)
    for _ in range(2):
        await adm.admit(principal, None, decision, None)
    with pytest.raises(RateLimited) as held:  # the holds of requests in flight leave no room: 429
        await adm.admit(principal, None, decision, None)
    assert held.value.code == "budget_held"
    # Two holds of $0.004, and a given-up try of $0.001 each besides (``worst_of``).
    assert (await state.budgets.spent("key:k")).reserved == pytest.approx(0.01)


async def test_tries_billed_without_serving_are_held_on_top_of_the_serving_try() -> None:
    """A try given up at a timeout is billed, and the next one spends again. A request holds in
    its budgets, in one step with its hold, a given-up try besides (its expected cost, as far as
    each has room); a billed try is paid out of that, and what it does not cover is held on top
    (here in the task's, which had room for a fifth of it when the request was admitted), refused
    as a request is when it does not fit; settled at 0, it gives the money back."""
    state = MemoryState()
    adm = Admission(state.limits, state.budgets)
    decision = Decision("d", "p", ["a"], [Estimate("a", 100, 50, 0, 0.001, hold_usd=0.004)], "why")
    assert admission.worst_of(decision) == pytest.approx(0.005)  # its hold, and one given-up try
    principal = Principal(key_id="k", name="k", budget_usd=0.01)
    other = await state.budgets.reserve(["task:t"], 0.0158, {"task:t": 0.02})  # another of the task's
    held = await adm.admit(principal, "t", decision, 0.02)
    assert held is not None and held.held_in("key:k") == pytest.approx(0.005)
    assert held.held_in("task:t") == pytest.approx(0.0042)
    await state.budgets.release(other)

    async def reserved() -> list[float]:
        return [(await state.budgets.spent(scope)).reserved for scope in ("key:k", "task:t")]

    # One try given up: the key pays it out of what it holds, the task holds the rest on top.
    first = await adm.hold_billed(principal, "t", decision, 0.02, 0.001, held, [])
    assert first is not None and first.scopes == ("task:t",)
    assert await reserved() == [pytest.approx(0.005), pytest.approx(0.005)]
    # Another, billed $0.002: held on top in both.
    second = await adm.hold_billed(principal, "t", decision, 0.02, 0.003, held, [first])
    assert second is not None and second.scopes == ("key:k", "task:t")
    assert await reserved() == [pytest.approx(0.007), pytest.approx(0.007)]
    with pytest.raises(RateLimited):  # $0.004 more does not fit the key's $0.01 beside the $0.007
        await adm.hold_billed(principal, "t", decision, 0.02, 0.007, held, [first, second])
    assert await adm.hold_billed(principal, "t", decision, 0.02, 0.003, held, [first, second]) is None
    await adm.settle(second, 0.0)
    assert await reserved() == [pytest.approx(0.005), pytest.approx(0.005)]
    open_mode = Principal(key_id=None, name="open")
    assert await adm.hold_billed(open_mode, None, decision, None, 0.003, None, []) is None


async def test_a_keys_worst_case_is_held_in_one_step_with_the_hold() -> None:
    """Near a key budget's end a request's worst case is held with its hold, in one step, as far
    as the key has room then: held after it, two requests each held their one try and then
    neither had room for its worst case (both refused), or one was admitted without it. Held as
    far as the key had room when read before the decision, a request refused for its worst case
    where its hold alone would fit was told to retry (429) while the key had room for it."""
    state = MemoryState()
    adm = Admission(state.limits, state.budgets)
    decision = Decision("d", "p", ["a"], [Estimate("a", 100, 50, 0, 0.001, hold_usd=0.004)], "why")
    principal = Principal(key_id="k", name="k", budget_usd=0.008)
    first = await adm.admit(principal, None, decision, None)
    assert first is not None and first.held_in("key:k") == pytest.approx(0.005)
    with pytest.raises(RateLimited) as held:  # $0.003 left beside the first: not even a hold
        await adm.admit(principal, None, decision, None)
    assert held.value.code == "budget_held"
    await adm.settle(first, 0.004)
    # $0.004 left: its hold, and no more.
    second = await adm.admit(principal, None, decision, None)
    assert second is not None and second.held_in("key:k") == pytest.approx(0.004) and second.more == {}
    await adm.settle(second, 0.004)
    with pytest.raises(BudgetExceeded):
        await adm.admit(principal, None, decision, None)


async def test_requests_whose_first_tries_time_out_near_a_key_budgets_end_are_served(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """Requests at once on a key with room for two and a half holds, each first try given up at
    the first-token timeout (billed) before the dearer backend serves: the first two held the
    dearer backend's cost, a third the rest, and each was then refused what its given-up try cost
    (429: the others held it), none served. The first now holds a given-up try too, in one step
    with its hold, and pays the try out of it; the others are refused before they pay. Four keys
    at once, eight requests each: the interleaving that starved a key came about now and then."""
    models = [
        model("faulty", fake.url, "ttft_ms=1500"),
        model("good", fake.url, prices={"input": 2.0, "output": 4.0}),
    ]
    quick = Timeouts(connect=1.0, first_token=0.5, idle=5.0, overall=10.0)
    body = {"reasoning_effort": "high", "max_tokens": 600, "stream": True}
    async with serving(tmp_path, models, master_key=MASTER, timeouts=quick) as r:
        seen = (await r.client.post("/v1/route", json={**BODIES[OPENAI_CHAT], **body},
                                    headers={"x-api-key": MASTER})).json()  # fmt: skip
        assert seen["order"] == ["faulty", "good"]
        budget = 2.5 * max(c["hold_usd"] for c in seen["candidates"])
        keys = [await r.key(f"k{k}", budget_usd=budget) for k in range(4)]
        answers = await asyncio.gather(
            *(
                r.post(key=key, headers={"x-router-task-id": f"t{i}"}, **body)
                for key, _ in keys
                for i in range(8)
            )
        )
        used = [await settled(r, f"key:{key_id}") for _, key_id in keys]
    statuses = [[a.status_code for a in answers[8 * k : 8 * k + 8]] for k in range(4)]
    assert all(200 in of_key for of_key in statuses), statuses
    assert all(u.spent <= budget for u in used), (used, budget, statuses)


async def test_a_model_billed_on_every_call_is_charged_and_held_its_fee(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """A search model behind Chat Completions bills a search on every call ($0.01 for
    gpt-5-search-api) and its reply shows none: priced by its tokens alone, a key with $0.015
    would be served a hundred calls of ~$0.0001 each billed ~$0.0101. With ``prices.per_request``
    the charge, the hold and the log have the fee: the second call does not fit."""
    searching = model("a", fake.url, prices={"input": 1.0, "output": 2.0, "per_request": 0.01})
    async with serving(tmp_path, [searching], master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=0.015)
        served = await r.post(key=key, max_tokens=MAX_TOKENS)
        await settled(r, f"key:{key_id}")
        refused = await r.post(key=key, max_tokens=MAX_TOKENS)
        rows = await r.records()
    assert served.status_code == 200 and refused.status_code == 403, refused.text
    row = rows[0]
    assert row.cost_tools_usd == pytest.approx(0.01)
    assert row.cost_usd == pytest.approx(hand_cost(row) + 0.01)
    assert float(served.headers["x-router-cost-usd"]) == pytest.approx(row.cost_usd)


async def test_a_running_requests_holds_are_renewed_until_they_close() -> None:
    """``keep`` renews every hold it is given, read again each time (a request makes more as it
    runs), for as long as any is open, and ends by itself once they all are closed."""
    state = MemoryState(StateConfig(reservation_ttl_s=0.2))
    gate = Admission(state.limits, state.budgets)
    first = await state.budgets.reserve(["key:k"], 0.5, {"key:k": 1.0})
    holds: list[Reservation | None] = [first, None]
    keeping = asyncio.create_task(gate.keep(lambda: holds))
    await asyncio.sleep(0.25)
    second = await state.budgets.reserve(["key:k"], 0.25, {"key:k": 1.0})
    holds.append(second)
    await asyncio.sleep(0.5)  # both outlive their TTL
    assert await state.budgets.spent("key:k") == Spend(0.0, 0.75)
    await state.budgets.settle(first, 0.1)
    await state.budgets.release(second)
    await asyncio.wait_for(keeping, 1.0)
    assert await state.budgets.spent("key:k") == Spend(0.1, 0.0)


async def test_route_says_what_admission_holds_for_the_request(fake: FakeUpstream, tmp_path: Path) -> None:
    """``/v1/route`` showed each candidate's ``worst_usd`` (the call at worst), while a key's budget
    held, for the same request, a given-up try more (``worst_of``): a client could not read what
    its request would hold. It now says the request's ``hold_usd`` and ``worst_usd``, from the
    functions admission holds by, and a request in flight holds exactly them."""
    models = [
        model("cheap", fake.url, "ttft_ms=1000"),
        model("dear", fake.url, prices={"input": 2.0, "output": 4.0}),
    ]
    async with serving(tmp_path, models, master_key=MASTER) as r:
        key, key_id = await r.key(budget_usd=1.0)
        body = {**BODIES[OPENAI_CHAT], "max_tokens": MAX_TOKENS}
        seen = (
            await r.client.post("/v1/route", json=body, headers={"authorization": f"Bearer {key}"})
        ).json()
        flying = asyncio.create_task(r.post(key=key, max_tokens=MAX_TOKENS))

        async def reserved() -> float | None:
            return (await r.s.state.budgets.spent(f"key:{key_id}")).reserved or None

        held = await eventually(reserved, what="the request's hold")
        assert (await flying).status_code == 200
    dearest = max(seen["candidates"], key=lambda c: c["cost_usd"])
    assert seen["hold_usd"] == pytest.approx(max(c["hold_usd"] for c in seen["candidates"]))
    assert seen["worst_usd"] == pytest.approx(dearest["worst_usd"] + dearest["cost_usd"])
    assert held == pytest.approx(seen["worst_usd"], abs=1e-9)


#: The budgets in this process, and in the machine's Redis (a prefix of the test's own).
STORES = ["memory", pytest.param("redis", marks=pytest.mark.integration)]


def shared(store: str) -> dict[str, Any]:
    """``serving``'s settings for budgets in ``store``."""
    if store == "memory":
        return {}
    return {
        "redis_url": "redis://127.0.0.1:6379/0",
        "redis_prefix": f"test:{uuid.uuid4().hex[:8]}:",
        "redis_timeout_s": 2.0,
    }


@pytest.mark.parametrize("store", STORES)
async def test_requests_at_once_hold_what_the_key_has_left_when_they_hold(
    fake: FakeUpstream, tmp_path: Path, store: str
) -> None:
    """A request held its key's worst case as far as the key had left when it was read, before
    the decision: two at once on a key with room for one worst case and one hold each read the
    whole budget, the first held its worst case, and the second, wanting as much, was refused
    (429) where its hold fitted (with Redis, whose every call lets the other request run; four
    keys at once). What a key holds beyond a request's hold is now what it has room for when it
    holds (in the same atomic step), so both are served within the budget."""
    slow = model("a", fake.url, "ttft_ms=500")
    async with serving(tmp_path, [slow], master_key=MASTER, **shared(store)) as r:
        seen = (await r.client.post("/v1/route", json={**BODIES[OPENAI_CHAT], "max_tokens": MAX_TOKENS},
                                    headers={"authorization": f"Bearer {MASTER}"})).json()  # fmt: skip
        budget = seen["worst_usd"] + seen["hold_usd"]
        keys = [await r.key(f"k{k}", budget_usd=budget) for k in range(4)]
        answers = await asyncio.gather(
            *(r.post(key=key, max_tokens=MAX_TOKENS) for key, _ in keys for _ in range(2))
        )
        used = [await settled(r, f"key:{key_id}") for _, key_id in keys]
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers if a.status_code != 200]
    assert all(u.spent <= budget for u in used)


@pytest.mark.parametrize("store", STORES)
async def test_requests_of_one_task_whose_first_tries_time_out_near_its_budgets_end_are_served(
    fake: FakeUpstream, tmp_path: Path, store: str
) -> None:
    """As a key's, a task's budget near its end: requests of one task at once, with room for two
    and a half holds, each first try given up at the first-token timeout (billed) before the
    dearer backend serves. The task held the serving try alone and each given-up try anew: the
    first two or three admitted held it whole, and each was refused its given-up try's cost (429:
    the others held it) after paying for it, none served. Every budget now holds a request's
    worst case as far as it has room, the task's as the key's. Four tasks at once, eight
    requests each."""
    models = [
        model("faulty", fake.url, "ttft_ms=1500"),
        model("good", fake.url, prices={"input": 2.0, "output": 4.0}),
    ]
    quick = Timeouts(connect=1.0, first_token=0.5, idle=5.0, overall=10.0)
    body = {"reasoning_effort": "high", "max_tokens": 600, "stream": True}
    (tmp_path / "probe").mkdir()
    async with serving(tmp_path / "probe", models) as probe:
        seen = (await probe.client.post("/v1/route", json={**BODIES[OPENAI_CHAT], **body})).json()
    assert seen["order"] == ["faulty", "good"]
    budget = 2.5 * seen["hold_usd"]
    objective = {"objective": {"max_cost_per_task": budget}}
    async with serving(tmp_path, models, policy=objective, timeouts=quick, **shared(store)) as r:
        answers = await asyncio.gather(
            *(r.post(headers={"x-router-task-id": f"t{t}"}, **body) for t in range(4) for _ in range(8))
        )
        await asyncio.gather(*(settled(r, f"task:t{t}") for t in range(4)))
        rows = await r.records()
    statuses = [[a.status_code for a in answers[8 * t : 8 * t + 8]] for t in range(4)]
    assert all(200 in of_task for of_task in statuses), statuses
    spent = {t: sum(row.cost_usd or 0.0 for row in rows if row.task_id == f"t{t}") for t in range(4)}
    assert all(usd <= budget + 1e-9 for usd in spent.values()), (spent, budget, statuses)


@pytest.mark.parametrize("store", STORES)
async def test_a_request_admitted_at_a_budgets_end_is_not_charged_a_try_it_cannot_follow(
    fake: FakeUpstream, tmp_path: Path, store: str
) -> None:
    """The last request admitted near a budget's end holds its hold and what room is left of its
    worst case, here a quarter of a given-up try. Its first try, given up at the first-token
    timeout while its backend reasoned, was billed, and the budget could not hold that and its
    next try: refused (429) after paying for the try. A try the budgets cannot give up and still
    follow is now waited for, to the overall deadline: the backend it pays serves it."""
    models = [
        model("faulty", fake.url, "ttft_ms=1500"),
        model("good", fake.url, prices={"input": 2.0, "output": 4.0}),
    ]
    quick = Timeouts(connect=1.0, first_token=0.5, idle=5.0, overall=10.0)
    body = {"reasoning_effort": "high", "max_tokens": 600, "stream": True}
    async with serving(tmp_path, models, master_key=MASTER, timeouts=quick, **shared(store)) as r:
        seen = (await r.client.post("/v1/route", json={**BODIES[OPENAI_CHAT], **body},
                                    headers={"x-api-key": MASTER})).json()  # fmt: skip
        assert seen["order"] == ["faulty", "good"]
        given_up = max(c["cost_usd"] for c in seen["candidates"])
        budget = seen["worst_usd"] + seen["hold_usd"] + given_up / 4
        key, key_id = await r.key(budget_usd=budget)
        first = asyncio.create_task(r.post(key=key, headers={"x-router-task-id": "first"}, **body))

        async def held() -> float | None:
            return (await r.s.state.budgets.spent(f"key:{key_id}")).reserved or None

        assert await eventually(held, what="the first request's hold") == pytest.approx(seen["worst_usd"])
        last = await r.post(key=key, headers={"x-router-task-id": "last"}, **body)
        assert (await first).status_code == 200
        used = await settled(r, f"key:{key_id}")
        rows = {row.task_id.rsplit("/", 1)[-1]: row for row in await r.records()}
    assert last.status_code == 200, (last.status_code, last.text, rows["last"].tries)
    assert [t.model for t in rows["last"].tries] == ["faulty"]  # waited for, past the first-token timeout
    assert used.spent <= budget
