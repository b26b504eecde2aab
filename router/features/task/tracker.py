"""What the router remembers about each live task: attempt, pin, failures, warm cache.

A task's *attempt* advances when the client says so (``X-Router-Attempt``) or when, after a
failed outcome, the conversation starts over (the same first message with no assistant turn
yet). Within an attempt the task is *pinned* to the model that served its first main-loop
request. Side calls never move the pin. The in-process tracker is bounded (LRU) so memory stays
flat however many tasks pass; replicas share this state through Redis (``router.shared``).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from router.digits import whole_number
from router.protocols.common import ClientRequest, text_of
from router.shared import AttemptMark

_SYSTEM_ROLES = ("system", "developer")
#: The highest attempt ``X-Router-Attempt`` may name (larger numbers are taken as this).
MAX_ATTEMPT = 1000
_SIDE_CALL_TEXT = re.compile(
    r"\b(title|summar(y|ize|ise)|compact|topic|one[- ]line|commit message|quota check)\b", re.IGNORECASE
)


@dataclass(slots=True)
class TaskState:
    attempt: int = 1
    pinned: str | None = None
    #: How many messages the request held that ``pinned`` first answered: the switch signals read
    #: only what came after it, so that a loop or a run of failures left behind on another model
    #: does not move the task off this one too (back and forth, each time a cold cache).
    pinned_since: int = 0
    #: The models this attempt's pin moved off (a switch, a fallback, a window outgrown): a later
    #: switch does not send the task back to one while another model can take it.
    left: list[str] = field(default_factory=list)
    failed_models: list[str] = field(default_factory=list)
    #: The current attempt was reported failed; the next restart of the conversation opens a new one.
    failed_open: bool = False
    vector: Mapping[int, float] | None = None
    warm_model: str | None = None
    warm_tokens: int = 0
    #: What ``warm_model`` reported cached of the call that left the prefix warm (None: not reported).
    warm_cached: int | None = None
    warm_until: float = 0.0
    #: The last weak label stored for the task (attempt, success, score, source): an unchanged
    #: label is not written again on every turn.
    last_label: tuple[int, bool, float, str, tuple[str, ...]] | None = None
    #: The attempt whose low P(success) already moved the task off its model (0: none): once per attempt.
    escalated: int = 0
    #: (attempt, messages) of the latest request whose label was read: an older one read later is dropped.
    label_at: tuple[int, int] = (0, 0)
    #: Main-loop calls the current attempt's model has answered (its cap counts these).
    calls: int = 0
    #: The attempt the router stopped (its cap or the stop-loss; 0: none), (why, rule) it was told,
    #: and what the policy said comes next (``router.policy.following``; None until it is asked).
    stopped: int = 0
    stop_said: tuple[str, str] | None = None
    stop_next: dict[str, Any] | None = None
    seen: float = field(default_factory=time.time)


def is_side_call(req: ClientRequest, max_tokens: int = 1024) -> bool:
    """Title generation, summaries, compaction, quota checks: short tool-less calls beside the loop."""
    if req.tools:
        return False
    last = req.messages[-1] if req.messages else {}
    last_text = text_of(last.get("content")) if isinstance(last, dict) else ""
    if _SIDE_CALL_TEXT.search(req.system_text[:4000]) or _SIDE_CALL_TEXT.search(last_text[-4000:]):
        return True
    if req.max_output_tokens is None or req.max_output_tokens > max_tokens:
        return False
    # OpenAI carries the system prompt as a message, Anthropic beside them: count the history only.
    history = [m for m in req.messages if not (isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES)]
    return len(history) <= 2


def is_restart(req: ClientRequest) -> bool:
    """The conversation has just begun: no assistant turn yet."""
    return not any(isinstance(m, dict) and m.get("role") == "assistant" for m in req.messages)


def adopt(state: TaskState, mark: AttemptMark | None) -> TaskState:
    """``state`` with what the replicas know of its latest attempt taken in: another replica may
    have served calls of it (a cap counts them all), heard that it failed (the next restart opens
    the next attempt), stopped it, or gone on to a later attempt. What this replica knows of a
    later attempt than the mark's is its own, and kept."""
    if mark is None or mark.attempt < state.attempt:
        return state
    if mark.attempt > state.attempt:
        _new_attempt(state, mark.attempt)
    state.calls = max(state.calls, mark.calls)
    state.failed_open = state.failed_open or mark.failed
    if mark.stop is not None and state.stopped != mark.attempt:
        state.stopped, state.stop_said, state.stop_next = mark.attempt, mark.stop, None
    return state


def _new_attempt(state: TaskState, n: int) -> None:
    if state.pinned and state.pinned not in state.failed_models:
        state.failed_models.append(state.pinned)
    state.attempt, state.pinned, state.failed_open, state.calls = n, None, False, 0
    state.pinned_since, state.left = 0, []


def key_of(task_id: str) -> str | None:
    """The virtual key a task id is scoped to (``{key_id}/{task}``), else None."""
    head, sep, _ = task_id.partition("/")
    return head if sep and head.startswith("key_") else None


class TaskTracker:
    """Bounded: at most ``max_tasks`` tasks, the least recently used dropped first; and one
    virtual key's tasks at most ``key_share`` of them, so that a key opening tasks without end
    drops its own oldest, never every other tenant's state."""

    def __init__(self, max_tasks: int = 100_000, key_share: float = 0.1) -> None:
        self._tasks: OrderedDict[str, TaskState] = OrderedDict()
        self._max = max_tasks
        self._max_per_key = max(1, int(max_tasks * key_share))
        #: Each key's tasks, least recently used first.
        self._by_key: dict[str, OrderedDict[str, None]] = {}

    def get(self, task_id: str) -> TaskState:
        state = self._tasks.get(task_id)
        key = key_of(task_id)
        if state is None:
            state = self._tasks[task_id] = TaskState()
            if key is not None:
                own = self._by_key.setdefault(key, OrderedDict())
                own[task_id] = None
                if len(own) > self._max_per_key:
                    self._drop(next(iter(own)))
            if len(self._tasks) > self._max:
                self._drop(next(iter(self._tasks)))
        else:
            self._tasks.move_to_end(task_id)
            if key is not None:
                self._by_key[key].move_to_end(task_id)
        state.seen = time.time()
        return state

    def _drop(self, task_id: str) -> None:
        del self._tasks[task_id]
        if (key := key_of(task_id)) is not None:
            own = self._by_key[key]
            del own[task_id]
            if not own:
                del self._by_key[key]

    def peek(self, task_id: str) -> TaskState | None:
        return self._tasks.get(task_id)

    def begin(
        self, task_id: str, req: ClientRequest, attempt_header: str | None, mark: AttemptMark | None = None
    ) -> TaskState:
        """The task's state for this request, opening a new attempt when one has begun. ``mark``:
        the task's latest attempt as the replicas share it, taken in first (``adopt``)."""
        return self._advance(adopt(self.get(task_id), mark), req, attempt_header)

    def preview(
        self, task_id: str, req: ClientRequest, attempt_header: str | None, mark: AttemptMark | None = None
    ) -> TaskState:
        """What ``begin`` would return, as a copy: the tracker is left as it is."""
        known = self._tasks.get(task_id)
        state = TaskState() if known is None else replace(known, failed_models=list(known.failed_models))
        return self._advance(adopt(state, mark), req, attempt_header)

    @staticmethod
    def _advance(state: TaskState, req: ClientRequest, attempt_header: str | None) -> TaskState:
        if (given := whole_number(attempt_header, MAX_ATTEMPT)) is not None:
            n = max(1, given)
            if n != state.attempt:
                _new_attempt(state, n)
        elif state.failed_open and is_restart(req):
            _new_attempt(state, state.attempt + 1)
        return state

    def outcome(self, task_id: str, attempt: int | None, success: bool) -> None:
        state = self._tasks.get(task_id)
        if state is None or (attempt is not None and attempt != state.attempt):
            return
        state.failed_open = not success

    def served(
        self, state: TaskState, model: str, prompt_tokens: int, cache_ttl_s: float, side_call: bool,
        cached_tokens: int | None = None, messages: int = 0,
    ) -> None:  # fmt: skip
        """``messages``: how many the request held (where a new pin's own turns begin)."""
        if side_call:
            return
        # The first main-loop request pins the attempt; a later switch (a loop, a context that
        # outgrew the window) moves the pin with it.
        if state.pinned != model:
            if state.pinned is not None and state.pinned not in state.left:
                state.left.append(state.pinned)
            state.pinned_since = messages
        state.pinned = model
        state.calls += 1
        state.warm_model, state.warm_tokens, state.warm_cached = model, prompt_tokens, cached_tokens
        state.warm_until = time.time() + cache_ttl_s

    @staticmethod
    def warm(state: TaskState) -> tuple[str | None, int, int | None]:
        """The warm backend, the tokens of its prefix and what it reported cached (within the cache's lifetime)."""
        if state.warm_model and time.time() < state.warm_until:
            return state.warm_model, state.warm_tokens, state.warm_cached
        return None, 0, None
