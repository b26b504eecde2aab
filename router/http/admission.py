"""Admission: per-key rate limits and budgets (per key, per task), before a backend is called.

Budgets reserve the decision's estimated cost atomically across every scope (the key's and the
task's) before the call and settle the actual cost after it, so concurrent requests — on one
replica or many, through ``router.state`` — cannot overspend by more than what is in flight.
Rate limits are a sliding window of requests and tokens per key. A budget store that cannot be
reached refuses the request (503): money is not spent blind. Rate limits fall back to local
counts instead (the state layer counts each such fail-open).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from router.errors import RateLimited
from router.http.auth import Principal
from router.policy.decide import Decision
from router.state import Reservation, StateUnavailable
from router.store.records import RequestRecord

if TYPE_CHECKING:
    from router.app.factory import Services

log = logging.getLogger("router.http.admission")


async def admit(
    s: Services, principal: Principal, rec: RequestRecord, decision: Decision
) -> Reservation | None:
    if principal.key_id and (principal.rpm or principal.tpm):
        est = decision.estimate(decision.chosen)
        tokens = (est.prompt_tokens + est.output_tokens) if est else 0
        verdict = await s.state.limits.check_and_consume(
            principal.key_id,
            requests=1,
            tokens=tokens if principal.tpm else 0,
            rpm=principal.rpm,
            tpm=principal.tpm,
        )
        if not verdict:
            raise RateLimited(
                f"this key's {verdict.reason} limit is reached",
                retry_after=min(verdict.retry_after_s, 3600.0),
            )
    limits: dict[str, float] = {}
    if principal.key_id and principal.budget_usd is not None:
        limits[f"key:{principal.key_id}"] = principal.budget_usd
    task_budget = s.decider.policy.spec.objective.max_cost_per_task
    if task_budget is not None and rec.task_id:
        limits[f"task:{rec.task_id}"] = task_budget
    if not limits:
        return None
    amount = rec.cost_est_usd or 0.0
    return await s.state.budgets.reserve(list(limits), amount, limits)


async def settle(s: Services, reservation: Reservation, actual_usd: float | None) -> None:
    """Turn the hold into spend (a failed request spends what it used, usually nothing)."""
    try:
        await s.state.budgets.settle(reservation, actual_usd or 0.0)
    except StateUnavailable as exc:
        # The hold expires by itself; the log keeps the real cost. Nothing to fail here.
        log.warning(
            "budget settle skipped (%s): reservation %s expires on its own", exc.reason, reservation.id
        )
