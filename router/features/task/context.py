"""A request's place in its task: attempt, pin, side call, task vector, signals, budget left.

``TaskContext.enter`` runs between measuring the prompt and deciding, and returns what the
request learnt of its task (a ``TaskView``); ``served`` runs once a backend has answered.
``preview`` answers the same question for ``/v1/route`` without changing anything. Weak outcome
labels read from the conversation are written off the request path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final, Protocol

from router.background import Background
from router.features import labels, signals
from router.features.task import attempt
from router.features.task.rules import TaskRules
from router.features.task.tracker import TaskState, TaskTracker, is_side_call
from router.features.task.vector import Packed, Vector, repo_hint, task_vector
from router.protocols.common import ANTHROPIC, OPENAI_RESPONSES, ClientRequest
from router.shared import AttemptMark, Budgets, Sessions, StateUnavailable
from router.store.records import OutcomeRecord

log = logging.getLogger("router.features.task.context")

#: Signals that mean "this model is stuck": the pinned model is left if another may take over.
SWITCH_SIGNALS = frozenset({"tool_loop", "tool_failures"})
#: The switch reason when the outcome label says the attempt is failing (``tasks.escalate_below``).
LOW_P_SUCCESS = "low_p_success"
#: A conversation with at most this many messages not yet read (a turn adds two) is labelled on
#: the event loop; more (a restart, a task joined midway) go to a worker thread.
INLINE_MESSAGES: Final = 16


class LabelWriter(Protocol):
    def submit_label(self, rec: OutcomeRecord) -> None: ...


@dataclass(frozen=True, slots=True)
class TaskView:
    """What one request knows of its task when it is decided."""

    task_id: str
    state: TaskState
    attempt: int
    side_call: bool
    vector: Mapping[int, float] | None
    #: The vector was made by this request (the task's first main-loop request): the log keeps it,
    #: with the task's repository (``x-router-repo``, else a github.com URL in the opening message).
    new_vector: bool
    repo: str | None
    failed_models: tuple[str, ...]
    pinned: str | None
    switch_reason: str | None
    signed_history: str | None
    budget_left: float | None
    warm_model: str | None
    warm_tokens: int
    #: What the warm backend reported cached of the call that left the prefix warm (None: unknown).
    warm_cached: int | None
    #: The last messages as the switch signals read them; the label reads them again from here.
    recent: signals.Recent | None = None
    #: (why, rule) when the router has stopped the attempt (``stop``): the request is refused.
    stopped: tuple[str, str] | None = None
    #: What the stop-loss reads at this call (``reading``), whether a stop-loss is on or not: logged
    #: with the call, for ``router train`` to learn the stop-loss from.
    p_success: float | None = None
    #: How many messages (Responses: input items) the request held.
    messages: int = 0
    #: The models the attempt's pin moved off (``TaskState.left``).
    left_models: tuple[str, ...] = ()


class TaskContext:
    """``shared``: the replicas' pins and warm prefixes (None when this replica is alone)."""

    def __init__(
        self,
        tracker: TaskTracker,
        budgets: Budgets,
        labels: LabelWriter,
        background: Background,
        shared: Sessions | None = None,
    ) -> None:
        self.tracker = tracker
        self.budgets = budgets
        self.labels = labels
        self.background = background
        self.shared = shared

    async def enter(
        self,
        rules: TaskRules,
        req: ClientRequest,
        task_id: str,
        attempt_header: str | None,
        prompt_tokens: int,
        repo: str | None,
        seen: list[Any] | None,
        task_budget: float | None,
    ) -> TaskView:
        """``seen``: per-message slots kept with the conversation, where the signals' reading of each
        message is remembered (from ``router.features.memo``); ``task_budget``: the per-task budget
        of the policy that decides the request (a scope's may be lower than ``rules``' own)."""
        side = is_side_call(req, rules.side_call_max_tokens)
        mark = await self._mark(task_id, side)
        state = self.tracker.begin(task_id, req, attempt_header, mark)
        view = await self._view(
            rules, req, task_id, state, side, prompt_tokens, repo, seen, task_budget, mark
        )
        if view.side_call:
            return view
        was = state.stopped == state.attempt
        if (said := stop(rules, state)) is None:
            return view
        if not was and self.shared is not None:  # the other replicas refuse the attempt's calls too
            self.background.spawn(
                self.shared.mark_attempt(task_id, state.attempt, rules.abandon_after_s, failed=True, stop=said),
                name="share-stop",
            )  # fmt: skip
        return replace(view, stopped=said)

    async def _mark(self, task_id: str, side: bool) -> AttemptMark | None:
        """The task's latest attempt as the replicas share it (a side call does not need it)."""
        if self.shared is None or side:
            return None
        return await self.shared.attempt(task_id)

    def peek(self, task_id: str) -> TaskState | None:
        """What this replica remembers of the task, if anything (nothing changes)."""
        return self.tracker.peek(task_id)

    async def latest_attempt(self, task_id: str) -> int | None:
        """The task's latest attempt as this replica or, failing that, the replicas know it (None:
        neither knows the task; its log rows may still be on their way)."""
        if (state := self.tracker.peek(task_id)) is not None:
            return state.attempt
        mark = await self.shared.attempt(task_id) if self.shared is not None else None
        return mark.attempt if mark is not None else None

    async def outcome(self, task_id: str, attempt: int, success: bool, ttl_s: float) -> None:
        """An outcome of ``attempt`` was reported: a failure opens the next attempt at the next
        restart of the conversation, on whichever replica it lands."""
        self.tracker.outcome(task_id, attempt, success)
        if self.shared is not None:
            await self.shared.mark_attempt(task_id, attempt, ttl_s, failed=not success)

    async def stopped(self, task_id: str) -> dict[str, Any] | None:
        """The task's latest attempt the router stopped: which, by which rule, and ``next``, what
        the stop's error told the agent (and the outcome reply says; None where another replica
        stopped it and this one has not been asked since)."""
        state = self.tracker.peek(task_id)
        if state is not None and state.stopped and state.stop_said is not None:
            return {"attempt": state.stopped, "rule": state.stop_said[1], "next": state.stop_next}
        mark = await self.shared.attempt(task_id) if self.shared is not None else None
        if mark is None or mark.stop is None:
            return None
        return {"attempt": mark.attempt, "rule": mark.stop[1], "next": None}

    def label_reader(
        self, rules: TaskRules, req: ClientRequest, view: TaskView, resent: bool, seen: list[Any] | None
    ) -> Callable[[], None] | None:
        """The weak label's reading of the request's conversation, for the caller to run once the
        request has ended (the label reads the results in full, test summaries and build errors:
        the decision does not wait for it); None when there is nothing to read: a side call, or a
        conversation without tools (aider, a plain chat). ``resent``: the request repeats one of the
        task's last requests (``router.features.memo``)."""
        if view.side_call or not (resent or not signals.without_tools(seen, len(req.messages))):
            return None
        return partial(
            self._label, rules, req, view.task_id, view.state, view.attempt, resent, seen, view.recent
        )

    async def preview(
        self, rules: TaskRules, req: ClientRequest, task_id: str, attempt_header: str | None,
        prompt_tokens: int, repo: str | None, task_budget: float | None,
    ) -> TaskView:  # fmt: skip
        """What ``enter`` would return, leaving the tracker and the log as they are."""
        side = is_side_call(req, rules.side_call_max_tokens)
        mark = await self._mark(task_id, side)
        state = self.tracker.preview(task_id, req, attempt_header, mark)
        return await self._view(
            rules, req, task_id, state, side, prompt_tokens, repo, None, task_budget, mark
        )

    async def _view(
        self, rules: TaskRules, req: ClientRequest, task_id: str, state: TaskState, side: bool, prompt_tokens: int,
        repo: str | None, seen: list[Any] | None, task_budget: float | None, mark: AttemptMark | None,
    ) -> TaskView:  # fmt: skip
        if not side and state.pinned is None and self.shared is not None and _pin_is_current(state, mark):
            # Another replica may have started this task: its pin and warm prefix are shared.
            pin = await self.shared.pin(task_id)
            if pin is not None:
                state.pinned = pin.model
            warm = await self.shared.warm(task_id)
            if warm is not None and state.warm_model is None:
                state.warm_model, state.warm_until = warm.model, warm.until
                state.warm_tokens, state.warm_cached = prompt_tokens, None
        new_vector = state.vector is None and not side
        if new_vector:
            repo = repo_hint(req.first_user_text, repo, req.system_text)
            # Packed: the tracker keeps it for as long as it remembers the task.
            state.vector = Packed(vector_for(req, repo))
        switch = recent = None
        if not side:
            recent = signals.recent(req.messages, seen=seen)
            found = signals.switches(
                req.protocol, req.messages, loop_threshold=rules.loop_threshold, seen=seen,
                read=_since_pin(req.messages, state, recent, seen),
            )  # fmt: skip
            switch = next((sig.name for sig in found if sig.name in SWITCH_SIGNALS), None)
            switch = switch or escalation(rules.escalate_below, state)
        budget_left = None
        budget = least(rules.max_cost_per_task, task_budget)
        if budget is not None:
            # What is left of the task's budget steers the plan down to cheaper models as it runs
            # out, and leaves out of a side call's order the candidates it cannot hold (the budgets
            # hold the dearest backend of the order).
            with contextlib.suppress(StateUnavailable):
                used = await self.budgets.spent(f"task:{task_id}")
                budget_left = max(0.0, budget - used.spent - used.reserved)
        warm_model, warm_tokens, warm_cached = self.tracker.warm(state)
        return TaskView(
            task_id=task_id, state=state, attempt=state.attempt, side_call=side, vector=state.vector,
            new_vector=new_vector, repo=repo if new_vector else None, failed_models=tuple(state.failed_models), pinned=state.pinned,
            switch_reason=switch, signed_history=signed_history(req), budget_left=budget_left,
            warm_model=warm_model, warm_tokens=warm_tokens, warm_cached=warm_cached, recent=recent,
            messages=len(req.messages), left_models=tuple(state.left),
            # Read after the last await: ``stop`` reads the same label (labels are kept on the loop).
            p_success=None if side else reading(state),
        )  # fmt: skip

    def served(
        self, view: TaskView, model: str, prompt_tokens: int, cache_ttl_s: float, abandon_after_s: float,
        cached_tokens: int | None = None,
    ) -> None:  # fmt: skip
        """``model`` answered this main-loop request: pin the attempt to it, its prefix is warm
        (``cached_tokens``: what the provider reported cached of it, if it said)."""
        self.tracker.served(
            view.state, model, prompt_tokens, cache_ttl_s, False, cached_tokens, view.messages
        )
        if self.shared is not None:  # alone, the tracker already holds it
            self.background.spawn(
                self._share(view.task_id, view.attempt, model, cache_ttl_s, abandon_after_s), name="share-pin"
            )

    async def _share(
        self, task_id: str, attempt: int, model: str, cache_ttl_s: float, abandon_after_s: float
    ) -> None:
        """Tell the other replicas where this task is pinned, where its prefix is warm, and that
        its attempt made one more call."""
        assert self.shared is not None
        await self.shared.set_pin(task_id, model, abandon_after_s)
        await self.shared.mark_warm(task_id, model, cache_ttl_s)
        await self.shared.count_call(task_id, attempt, abandon_after_s)

    def _label(
        self, rules: TaskRules, req: ClientRequest, task_id: str, state: TaskState, attempt: int,
        resent: bool, seen: list[Any] | None, recent: signals.Recent | None,
    ) -> None:  # fmt: skip
        read = partial(weak_label, req, rules.loop_threshold, resent, seen, rules.label_model, recent)
        if labels.unread(seen, len(req.messages), INLINE_MESSAGES) <= INLINE_MESSAGES:
            # Earlier turns read the rest: the new messages cost less here, once the reply is out,
            # than handing them to a worker thread (and the GIL back and forth while replies wait).
            try:
                label = read()
            except Exception:  # the request's accounting, which runs next, must not be lost to it
                log.exception("the weak label of task %s could not be read", task_id)
                return
            self._keep_label(task_id, state, attempt, len(req.messages), label)
        else:
            self.background.spawn(self._label_in_thread(read, task_id, state, attempt, len(req.messages)),
                                  name="weak-outcome")  # fmt: skip

    async def _label_in_thread(
        self, read: Callable[[], signals.WeakLabel], task_id: str, state: TaskState, attempt: int, n: int
    ) -> None:
        # A conversation the router has not seen yet (a restart, a task joined midway) is read whole,
        # tens of ms for a long one: a worker thread does it, and the loop keeps answering requests.
        label = await self.background.in_thread(read)
        self._keep_label(task_id, state, attempt, n, label)

    def _keep_label(
        self, task_id: str, state: TaskState, attempt: int, n: int, label: signals.WeakLabel
    ) -> None:
        if (attempt, n) < state.label_at:
            return  # a later request of the attempt was labelled meanwhile
        state.label_at = (attempt, n)
        # The signals riding along (a resend, a loop) are part of what is stored, so part of the key.
        key = (attempt, label.success, label.score, label.source, tuple(label.details.get("signals", ())))
        if key == state.last_label:
            return  # stored already, and still the latest
        out = OutcomeRecord(
            task_id=task_id, attempt=attempt, success=label.success, score=label.score,
            source=label.source, details=label.details, ts=time.time(), explicit=False,
        )  # fmt: skip
        # Queued for the log's batched writes, which retry a store that fails.
        self.labels.submit_label(out)
        state.last_label = key


def _pin_is_current(state: TaskState, mark: AttemptMark | None) -> bool:
    """Whether the shared pin is this attempt's: it outlives its attempt (the pin names the model
    that served the attempt before, until it expires), so it is read only where a replica served
    this attempt (or no mark says which attempt it belongs to: one written before marks were)."""
    return mark is None or (mark.attempt == state.attempt and mark.calls > 0)


def signed_history(req: ClientRequest) -> str | None:
    """Which protocol's provider-signed state the history carries, if any."""
    if req.protocol not in (ANTHROPIC, OPENAI_RESPONSES):
        return None  # Chat Completions carries none: no need to look at every message
    if req.signed_blocks is not None:  # read in the parser's pass over every block
        return ANTHROPIC if req.signed_blocks else None
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


def vector_for(req: ClientRequest, repo: str | None = None) -> Vector:
    """The task features of a request that starts a task (the same code for proxy, train, eval)."""
    return task_vector(req.first_user_text, req.system_text, len(req.tools), repo)


def stop(rules: TaskRules, state: TaskState) -> tuple[str, str] | None:
    """(why, rule) when the attempt ends here: its model's cap is reached or the stop-loss fires on
    the attempt's latest stored label (``router.features.task.attempt``). The attempt counts as
    failed, the next restart of the conversation opens the next one (on the plan's next model), and
    until then every main-loop request of the attempt is told the same. What comes next is the
    policy's to say (``router.policy.following``): the caller raises ``AttemptStopped``."""
    if state.stopped == state.attempt and state.stop_said is not None:
        return state.stop_said
    model = state.pinned
    control = rules.attempt_controls.get(model) if model is not None else None
    if control is None or model is None:
        return None
    reason = attempt.stop_reason(control, state.calls, p := reading(state))
    if reason is None:
        return None
    state.stopped, state.failed_open, state.stop_next = state.attempt, True, None
    state.stop_said = (attempt.message(reason, model, state.calls, control, p), reason)
    return state.stop_said


def reading(state: TaskState) -> float | None:
    """The label model's P(success) of the attempt's conversation so far: what the stop-loss reads
    (the latest stored label of the current attempt, read off the request path), else None."""
    label = state.last_label
    return label[2] if label is not None and label[0] == state.attempt and label[3] == labels.SOURCE else None


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


def weak_label(
    req: ClientRequest,
    loop_threshold: int,
    resent: bool,
    seen: list[Any] | None = None,
    model: labels.LabelModel | None = None,
    recent: signals.Recent | None = None,
) -> signals.WeakLabel:
    """What the conversation says of how its task goes: the label model's P(success), with the
    signals that explain it (``seen``, ``recent``: as for ``signals.extract``'s ``seen`` and
    ``read``). `router eval-labels` measures exactly this function on replayed agent runs."""
    recent = recent or signals.recent(req.messages, seen=seen)
    found = signals.extract(req.protocol, req.messages, loop_threshold=loop_threshold, seen=seen, read=recent)
    if resent:
        found.append(signals.resent_signal(1))
    model = model or labels.default()
    return labels.label(labels.read(req.messages, model, seen), model, found)


def least(*budgets: float | None) -> float | None:
    """The lowest of the budgets that are set (None when none is)."""
    return min((b for b in budgets if b is not None), default=None)


def _since_pin(
    messages: list[Any], state: TaskState, recent: signals.Recent, seen: list[Any] | None
) -> signals.Recent:
    """The last messages the switch signals read: only those after the pinned model's first turn.

    A loop or a run of failures stays in the window for many turns after the task left the model
    that made it; read again, it would move the task off the model it went to as well, and back
    on the next turn, each time to a cold cache. A conversation shorter than the pin's start (it
    was compacted, or Responses sends only new items) is read whole: what is left is new.
    """
    since = state.pinned_since
    if state.pinned is None or not 0 < since < len(messages) or len(messages) - since >= signals.WINDOW:
        return recent
    return signals.recent(messages, window=len(messages) - since, seen=seen)
