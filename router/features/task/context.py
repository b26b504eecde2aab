"""A request's place in its task: attempt, pin, side call, features, signals.

Called by the proxy between parsing and deciding (``enter``) and after a backend has served
(``served``). Weak outcome labels read from the conversation are written off the request path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from router.features.request import Features
from router.features.task import vector as taskfeatures
from router.features.task.tracker import TaskState, is_side_call
from router.learning import labels, signals
from router.protocols.common import ANTHROPIC, OPENAI_RESPONSES, ClientRequest, text_of
from router.state import StateUnavailable
from router.store.records import OutcomeRecord, RequestRecord

if TYPE_CHECKING:
    from router.app.factory import Services

log = logging.getLogger("router.features.task.identity")

#: Signals that mean "this model is stuck": the pinned model is left if another may take over.
SWITCH_SIGNALS = frozenset({"tool_loop", "tool_failures"})
#: The switch reason when the outcome label says the attempt is failing (``tasks.escalate_below``).
LOW_P_SUCCESS = "low_p_success"


def signed_history(req: ClientRequest) -> str | None:
    """Which protocol's provider-signed state the history carries, if any."""
    if req.protocol not in (ANTHROPIC, OPENAI_RESPONSES):
        return None  # Chat Completions carries none: no need to look at every message
    for m in req.messages:
        if not isinstance(m, dict):
            continue
        if req.protocol == OPENAI_RESPONSES and m.get("type") == "reasoning" and m.get("encrypted_content"):
            return OPENAI_RESPONSES
        content = m.get("content")
        if req.protocol == ANTHROPIC and m.get("role") == "assistant" and isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and (
                    block.get("type") == "redacted_thinking"
                    or (block.get("type") == "thinking" and block.get("signature"))
                ):
                    return ANTHROPIC
    return None


def _system_text(system: object) -> str:
    if isinstance(system, list):
        return "\n".join(text_of(s) if not isinstance(s, dict) else str(s.get("text") or "") for s in system)
    return text_of(system)


async def enter(
    s: Services,
    req: ClientRequest,
    feats: Features,
    rec: RequestRecord,
    attempt_header: str | None,
    resent: bool = False,
    seen: list[Any] | None = None,
) -> TaskState:
    """``resent``: the request repeats one of the task's last requests; ``seen``: per-message
    slots kept with the conversation, where the signals' reading of each message is remembered
    (both from ``router.features.memo``)."""
    assert rec.task_id is not None
    policy = s.decider.policy
    state = s.tracker.begin(rec.task_id, req, attempt_header)
    side = is_side_call(req, policy.spec.tasks.side_call_max_tokens)
    if not side and state.pinned is None and s.settings.redis_url:
        # Another replica may have started this task: its pin and warm prefix are shared.
        pin = await s.state.sessions.pin(rec.task_id)
        if pin is not None:
            state.pinned = pin.model
        warm = await s.state.sessions.warm(rec.task_id)
        if warm is not None and state.warm_model is None:
            state.warm_model, state.warm_until = warm.model, warm.until
            state.warm_tokens = feats.prompt_tokens
    rec.attempt, rec.side_call = state.attempt, side
    if state.vector is None and not side:
        # Packed: the tracker keeps it for as long as it remembers the task.
        rec.repo = taskfeatures.repo_hint(req.first_user_text, feats.headers.get("x-router-repo"))
        state.vector = taskfeatures.Packed(vector_for(req, rec.repo))
        rec.task_features = taskfeatures.to_json(state.vector)
    switch = None
    if not side:
        threshold = policy.spec.tasks.loop_threshold
        found = signals.switches(req.protocol, req.messages, loop_threshold=threshold, seen=seen)
        switch = next((sig.name for sig in found if sig.name in SWITCH_SIGNALS), None)
        switch = switch or escalation(policy.spec.tasks.escalate_below, state)
        # The weak label reads the results in full (test summaries, build errors): the decision
        # does not wait for it. A conversation without tools (aider, a plain chat) has none to read.
        if resent or not signals.without_tools(seen, len(req.messages)):
            label = _write_weak_label(s, req, rec.task_id, state, resent, seen)
            s.tasks.spawn(label, name="weak-outcome")
    budget = policy.spec.objective.max_cost_per_task
    if budget is not None and not side:
        # What is left of the task's budget steers the plan down to cheaper models as it runs out.
        with contextlib.suppress(StateUnavailable):
            used = await s.state.budgets.spent(f"task:{rec.task_id}")
            feats.task_budget_left = max(0.0, budget - used.spent - used.reserved)
    warm_model, warm_tokens = s.tracker.warm(state)
    feats.side_call = side
    feats.task_vector = state.vector
    feats.attempt = state.attempt
    feats.failed_models = tuple(state.failed_models)
    feats.pinned = state.pinned
    feats.switch_reason = switch
    feats.signed_history = signed_history(req)
    feats.warm_model, feats.warm_tokens = warm_model, warm_tokens
    return state


def escalation(threshold: float | None, state: TaskState) -> str | None:
    """``LOW_P_SUCCESS`` when the attempt's latest stored label puts P(success) below ``threshold``.

    That label was computed off the request path after an earlier request of the attempt: the
    decision waits for nothing. Once per attempt, so that the task does not swing back.
    """
    label = state.last_label
    if threshold is None or label is None or state.escalated == state.attempt:
        return None
    attempt, _, p, source, _ = label
    if attempt != state.attempt or source != labels.SOURCE or p >= threshold:
        return None
    state.escalated = state.attempt
    return LOW_P_SUCCESS


def served(s: Services, state: TaskState, rec: RequestRecord) -> None:
    if rec.chosen_model is None or rec.status != 200 or rec.side_call or rec.task_id is None:
        return
    backend = s.catalog[rec.chosen_model]
    s.tracker.served(
        state, backend.id, rec.input_tokens or rec.prompt_tokens_est or 0, backend.cache_ttl_s, False
    )
    if s.settings.redis_url:  # alone, the tracker already holds it
        s.tasks.spawn(_share(s, rec.task_id, backend.id, backend.cache_ttl_s), name="share-pin")


async def _share(s: Services, task_id: str, model: str, cache_ttl_s: float) -> None:
    """Tell the other replicas where this task is pinned and where its prefix is warm."""
    await s.state.sessions.set_pin(task_id, model, s.decider.policy.spec.tasks.abandon_after_s)
    await s.state.sessions.mark_warm(task_id, model, cache_ttl_s)


def preview_task(s: Services, req: ClientRequest, feats: Features) -> None:
    """Task features for a decision preview (``/v1/route``), leaving the tracker untouched."""
    feats.side_call = is_side_call(req, s.decider.policy.spec.tasks.side_call_max_tokens)
    if not feats.side_call:
        feats.task_vector = vector_for(req, feats.headers.get("x-router-repo"))


def vector_for(req: ClientRequest, repo: str | None = None) -> taskfeatures.Vector:
    """The task features of a request that starts a task (the same code for proxy, train, eval)."""
    return taskfeatures.task_vector(req.first_user_text, _system_text(req.system), len(req.tools), repo)


def weak_label(
    req: ClientRequest,
    loop_threshold: int,
    resent: bool,
    seen: list[Any] | None = None,
    model: labels.LabelModel | None = None,
) -> signals.WeakLabel:
    """What the conversation says of how its task goes: the label model's P(success), with the
    signals that explain it (``seen``: as for ``signals.extract``). `router eval-labels` measures
    exactly this function on replayed agent runs."""
    found = signals.extract(req.protocol, req.messages, loop_threshold=loop_threshold, seen=seen)
    if resent:
        found.append(signals.resent_signal(1))
    model = model or labels.default()
    return labels.label(labels.read(req.messages, model, seen), model, found)


async def _write_weak_label(
    s: Services, req: ClientRequest, task_id: str, state: TaskState, resent: bool, seen: list[Any] | None
) -> None:
    attempt = state.attempt
    policy = s.decider.policy
    # A conversation the router has not seen yet (a restart, a task joined midway) is read whole,
    # tens of ms for a long one: a worker thread does it, and the loop keeps answering requests.
    label = await s.tasks.spawn_blocking(
        weak_label,
        req,
        policy.spec.tasks.loop_threshold,
        resent,
        seen,
        policy.label_model,
        name="read-outcome",
    )
    at = (attempt, len(req.messages))
    if at < state.label_at:
        return  # a later request of the attempt was labelled meanwhile
    state.label_at = at
    # The signals riding along (a resend, a loop) are part of what is stored, so part of the key.
    key = (attempt, label.success, label.score, label.source, tuple(label.details.get("signals", ())))
    if key == state.last_label:
        return  # stored already, and still the latest
    out = OutcomeRecord(
        task_id=task_id, attempt=attempt, success=label.success, score=label.score,
        source=label.source, details=label.details, ts=time.time(), explicit=False,
    )  # fmt: skip
    # Best effort: the conversation repeats its signals on the next request, which writes again.
    try:
        await s.store.write_outcome(out)
        state.last_label = key
    except Exception as exc:
        log.warning(
            "weak outcome label not stored (%s); the next request of the task retries", type(exc).__name__
        )
