"""Task outcomes: explicit verdicts from clients, and weak labels read from conversations.

``POST /v1/outcomes`` records a verdict on one attempt of a task. It is idempotent per
(task, attempt): sending the same verdict twice stores one row, and a later verdict replaces an
earlier one. Signals the router reads from the conversation (test summaries, exit codes,
loops) are stored beside it with their own source; at training time an explicit outcome
overrides every weak label.

A failure is answered with what the learned policy recommends next (``next``): another attempt,
on which model, with what chance of completing the task and at what expected cost — or stop,
when the next attempt is expected to be worth less than it costs (``LearnedScorer.recommend``).
A harness (CI, a batch runner) can ask this; if it retries anyway, the router serves the best
plan that remains. Without a learned policy, or without the task's features, ``next`` is null. For
an attempt the router stopped (a cap, the stop-loss) ``next`` is what its error told the agent
(``router.policy.following``), learned policy or not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from router.errors import AttemptNotFound, BadRequest, TaskNotFound
from router.features.task import vector as taskfeatures
from router.features.task.context import TaskContext
from router.features.task.identity import scoped
from router.features.task.tracker import TaskState
from router.http.auth import Auth, Principal
from router.http.endpoints import keyed
from router.http.proxy import read_body
from router.http.replies import json_reply
from router.policy import following
from router.policy.active import ActivePolicy, ActivePolicyHolder
from router.policy.control import CONTROL
from router.policy.decide import Decider
from router.protocols.common import load_json, validation_message
from router.store import Store
from router.store.records import OutcomeRecord, RequestRecord

EXPLICIT = "explicit"
#: The task's latest requests an outcome reads (its attempt, route, scope and failed models).
OUTCOME_ROWS = 1_000
#: The most an outcome's ``details`` may take, as JSON. They were kept whatever their size (up to
#: the body cap, 32 MiB): a key that served a few calls of a cent's thousandth could store gigabytes,
#: and every view of the dashboard read each outcome of its window into the router's memory (six of
#: 10 MB took /ui seven seconds and 70 MB).
MAX_DETAILS_BYTES = 64 * 1024


class OutcomeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: Annotated[str, Field(min_length=1, max_length=200)]
    #: A JSON boolean: a verdict written "yes", 1 or "false" is refused, never guessed at.
    success: StrictBool
    score: Annotated[float, Field(ge=0, le=1)] | None = None
    source: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    attempt: Annotated[int, Field(ge=1, le=1000)] | None = None
    details: dict[str, Any] | None = None


class Outcomes:
    """``POST /v1/outcomes``. ``runtime``: the policy in force, for the recommendation that answers
    a failure."""

    def __init__(
        self,
        *,
        auth: Auth,
        tasks: TaskContext,
        store: Store,
        runtime: ActivePolicyHolder,
        max_body_bytes: int,
    ) -> None:
        self.auth = auth
        self.tasks = tasks
        self.store = store
        self.runtime = runtime
        self.max_body_bytes = max_body_bytes

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/v1/outcomes", self.outcomes, methods=["POST"], tags=["outcomes"])

    @keyed()
    async def outcomes(self, request: Request, principal: Principal) -> Response:
        body = load_json(await read_body(request, self.max_body_bytes))
        try:
            out = OutcomeIn.model_validate(body)
        except ValidationError as exc:  # a 400 like every other endpoint's (FastAPI's default is 422)
            raise BadRequest(validation_message(exc)) from None
        if out.details and (size := len(orjson.dumps(out.details))) > MAX_DETAILS_BYTES:
            raise BadRequest(
                f"invalid request: details: {size} bytes of JSON, over the {MAX_DETAILS_BYTES} an outcome "
                "keeps; send a summary (counts, a link to the log) rather than the log itself",
                param="details",
            )  # fmt: skip
        # Another key's task is not found, not forbidden: its existence is not for this key to learn.
        out.task_id = scoped(principal.key_id, out.task_id)
        state = self.tasks.peek(out.task_id)
        # Read even when the task is in memory: the log says which route and scope decided it. The
        # latest requests hold the latest attempt and decision; a task may have any number.
        rows = await self.store.requests_for_task(out.task_id, OUTCOME_ROWS)
        latest = await self.tasks.latest_attempt(out.task_id)
        if latest is None and not rows:
            raise TaskNotFound(out.task_id)
        ran = max(latest or 1, max((r.attempt or 1 for r in rows), default=1))
        if out.attempt is not None and out.attempt > ran:
            # A verdict on an attempt no request ran in would label the task's next attempt
            # before it ran (training joins outcomes to attempts by number).
            raise AttemptNotFound(out.task_id, out.attempt, ran)
        attempt = out.attempt or latest or ran
        details = dict(out.details or {})
        if out.source:
            details["client_source"] = out.source
        rec = OutcomeRecord(
            task_id=out.task_id, attempt=attempt, success=out.success, score=out.score,
            source=EXPLICIT, details=details or None, ts=time.time(), explicit=True,
        )  # fmt: skip
        await self.store.write_outcome(rec)
        await self.tasks.outcome(
            out.task_id, attempt, out.success, self.runtime.current.policy.task_rules.abandon_after_s
        )
        result: dict[str, Any] = {
            "task_id": out.task_id,
            "attempt": attempt,
            "success": out.success,
            "recorded": True,
        }
        if not out.success:
            if state is not None and state.stopped == attempt and state.stop_next is not None:
                # The router stopped this attempt and told the agent what comes next: the same here.
                result["next"] = state.stop_next
            else:
                vec, failed = _known(state, rows, attempt)
                decider, allowed = deciding(self.runtime.current, out.task_id, rows)
                result["next"] = following.planned(decider, allowed, vec, attempt, failed)
        return json_reply(result)


def deciding(runtime: ActivePolicy, task_id: str, rows: list[RequestRecord]) -> tuple[Decider, list[str]]:
    """The decider in force for the task and the models its route allows, as its latest logged
    decision shows them: the scope that decided (the log's ``policy`` column names it) and the route
    of the model the client asked for. Without a logged decision: the task's arm, every model."""
    arm, decider = runtime.arm_for(task_id)
    main = [r for r in rows if not r.side_call and r.policy]
    latest = max(main, key=lambda r: r.ts, default=None)
    if latest is None:
        return decider, list(decider.policy.models)
    if arm != CONTROL:
        # The log keeps "<policy>[/<scope>]/<scorer>": the decider whose policy name is its prefix.
        named = (latest.policy or "").rsplit("/", 1)[0]
        decider = next((s.decider for s in runtime.scopes if s.decider.policy.name == named), decider)
    route = decider.policy.route_for(latest.requested_model or "")
    if route is None:
        return decider, list(decider.policy.models)
    return decider, route.chosen_among


def _known(
    state: TaskState | None, rows: list[RequestRecord], attempt: int
) -> tuple[Mapping[int, float] | None, list[str]]:
    """The task's vector and the models that failed it up to ``attempt``, from memory or the log
    (None and none where neither has the vector)."""
    if state is not None and state.vector is not None:
        failed = list(state.failed_models)
        if state.pinned and state.attempt == attempt and state.pinned not in failed:
            failed.append(state.pinned)
        return state.vector, failed
    main = [(r, r.chosen_model) for r in rows if not r.side_call and r.chosen_model]
    features = next((r.task_features for r, _ in main if r.task_features), None)
    if features is None:
        return None, []
    failed = list(dict.fromkeys(model for r, model in main if (r.attempt or 1) <= attempt))
    return taskfeatures.from_json(features), failed
