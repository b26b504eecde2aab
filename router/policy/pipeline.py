"""A parsed request → its Features → the decision: one path for the proxy and ``/v1/route``.

``decide`` sizes the prompt (``promptsize``), places the request in its task (``task.context``:
attempt, pin, signed history, warm cache, budget left), builds the ``Features`` once and asks the
request's runtime for a decision. ``preview`` is the same decision with nothing remembered: the
conversation memo, the task tracker and the outcome log stay as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from router.background import Background
from router.errors import AttemptStopped
from router.features.promptsize import DECIDING_INLINE_CHARS, INLINE_CHARS, PromptSize, PromptSizer
from router.features.request import Features, turn_shape
from router.features.task.context import TaskContext, TaskView
from router.policy import following
from router.policy.active import ActivePolicy
from router.policy.decide import Decider, Decision
from router.policy.scopes import scope_facts
from router.protocols.common import ClientRequest
from router.protocols.hosted import declared, max_uses

#: A request body this long or longer is parsed and sized on a thread of its own
#: (``Background.for_large``), not on the event loop: a body of many small JSON values (tens of
#: thousands of tools or messages) takes seconds to parse and size, and every other request in
#: flight waited for as long. Agents' bodies are far below it (the replayed runs' largest: 280 KB).
LARGE_BODY_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Decided:
    features: Features
    task: TaskView
    decision: Decision
    #: The prompt's size as measured; what is still pending is dealt with once the request has
    #: ended (``Pipeline.finish``). None for a preview.
    size: PromptSize | None = None
    #: The conversation memo knew the prompt's leading messages.
    remembered: bool = False
    #: The prompt had to be counted exactly before deciding (the estimate's bounds mattered).
    counted: bool = False
    #: The task's arm when the policy has a control arm ("control" or "treated"), else None.
    arm: str | None = None
    #: The weak label's reading of the conversation (``TaskContext.label_reader``), which
    #: ``Pipeline.finish`` runs once the request has ended; None when there is nothing to read.
    label: Callable[[], None] | None = None


class Pipeline:
    def __init__(self, sizer: PromptSizer, tasks: TaskContext, background: Background) -> None:
        self.sizer = sizer
        self.tasks = tasks
        self.background = background

    async def decide(
        self, rt: ActivePolicy, req: ClientRequest, task_id: str, key_id: str | None, headers: Mapping[str, str],
        attempt_header: str | None, body_bytes: int, key_budget_left: float | None = None,
    ) -> Decided:  # fmt: skip
        """``key_id``: the caller's virtual key, if any; ``headers``: those rules may read (no
        secrets); ``body_bytes``: the raw body's size, the memory the conversation memo charges for
        it; ``key_budget_left``: what the key may still spend (candidates that would not fit are
        excluded before ranking and exploration)."""
        size = await self._measure(req, task_id, body_bytes)
        arm, decider = _decider(rt, req, task_id, key_id, headers)
        repo = headers.get("x-router-repo")
        view = await self.tasks.enter(
            rt.policy.task_rules, req, task_id, attempt_header, size.tokens, repo, size.facts,
            decider.policy.objective.max_cost_per_task,
        )  # fmt: skip
        if view.stopped is not None:
            raise stopped(
                view, decider, request_features(req, size.tokens, headers, view, size, key_budget_left)
            )
        label = self.tasks.label_reader(rt.policy.task_rules, req, view, size.repeat, size.facts)
        try:
            feats = request_features(req, size.tokens, headers, view, size, key_budget_left)
            # A hard limit is never decided on a guess, and a short prompt nothing anchors (a
            # conversation's first request) is counted: once, and its o200k count converts well.
            counted = not size.settled and (
                self.sizer.wants_count(size) or decider.size_matters(feats, size.low, size.high)
            )
            if counted:
                await self._settle(size)
                feats = replace(feats, prompt_tokens=size.tokens, prompt_anchor=size.provider_tokens)
            decision = decider.decide(feats)
        except BaseException:
            if label is not None:
                label()  # the conversation says how the task goes, whatever became of this request
            raise
        return Decided(feats, view, decision, size, size.remembered > 0, counted, arm, label)

    async def preview(
        self, rt: ActivePolicy, req: ClientRequest, task_id: str, key_id: str | None, headers: Mapping[str, str],
        attempt_header: str | None, body_bytes: int, key_budget_left: float | None = None,
    ) -> Decided:  # fmt: skip
        """The decision ``decide`` would make now, on the exact prompt size, remembering nothing."""
        size = await self._measure(req, None, body_bytes)
        if not size.settled:
            await self._settle(size)
        arm, decider = _decider(rt, req, task_id, key_id, headers)
        repo = headers.get("x-router-repo")
        view = await self.tasks.preview(
            rt.policy.task_rules, req, task_id, attempt_header, size.tokens, repo,
            decider.policy.objective.max_cost_per_task,
        )  # fmt: skip
        feats = request_features(req, size.tokens, headers, view, size, key_budget_left)
        return Decided(feats, view, decider.decide(feats, explore=False), arm=arm)

    async def _measure(self, req: ClientRequest, task_id: str | None, body_bytes: int) -> PromptSize:
        """``sizer.measure``: on the event loop, or for a body of ``LARGE_BODY_BYTES`` or more on
        its thread (``Background.for_large``)."""
        if body_bytes < LARGE_BODY_BYTES:
            return self.sizer.measure(req, task_id, body_bytes)
        return await self.background.for_large(self.sizer.measure, req, task_id, body_bytes)

    async def parse(self, parse: Callable[[bytes], ClientRequest], raw: bytes) -> ClientRequest:
        """``parse(raw)`` (``parse_body``)."""
        return await parse_body(self.background, parse, raw)

    async def _settle(self, size: PromptSize) -> int:
        """``sizer.settle`` for a request that waits for it: on a worker thread unless the pending
        text is short (``DECIDING_INLINE_CHARS``). Tokenizing reads ~25 MB/s, so a large new prompt
        counted on the event loop stalled every other client for as long (a second for the body
        cap's 32 MiB); tiktoken lets go of the GIL while it encodes."""
        if size.pending_chars <= DECIDING_INLINE_CHARS:
            return self.sizer.settle(size)
        return await self.background.in_thread(self.sizer.settle, size)

    def finish(
        self, rt: ActivePolicy, decided: Decided, served_by: str | None, input_tokens: int | None,
        reported_input_tokens: int | None = None, reported_cached_tokens: int | None = None,
    ) -> None:  # fmt: skip
        """Once the request has ended: size the prompt exactly for the conversation's next turn
        (the provider's reported count, ``reported_input_tokens``, or else a count of what
        ``decide`` left pending), pin the task to the backend that served its main-loop request
        (its prefix warm, with what the provider said it cached of it), and read the weak label."""
        size = decided.size
        if size is not None:
            if reported_input_tokens and size.snapshot is not None and served_by:  # a 0 is no count
                b = rt.catalog[served_by]
                # The reply's count teaches the rate of b's tokens; now and then its tail is counted
                # too (a thread), for b's provider/o200k ratio of a conversation's tail.
                if self.sizer.reported(
                    size, reported_input_tokens, b.id, rt.decider.estimates.tokens_ratio(b.id, b.provider)
                ):
                    self.background.spawn_blocking(
                        self.sizer.learn_tail, size, reported_input_tokens, b.id, name="learn-tail"
                    )
            elif not size.settled:
                if size.pending_chars <= INLINE_CHARS:
                    self.sizer.settle(size)  # cheaper here than handing it to a thread
                else:
                    self.background.spawn_blocking(self.sizer.settle, size, name="count-tokens")
        if served_by is not None and not decided.task.side_call:
            backend = rt.catalog[served_by]
            self.tasks.served(
                decided.task, backend.id, input_tokens or decided.features.prompt_tokens, backend.cache_ttl_s,
                rt.policy.spec.tasks.abandon_after_s, reported_cached_tokens,
            )  # fmt: skip
        if decided.label is not None:
            decided.label()


async def parse_body(
    background: Background, parse: Callable[[bytes], ClientRequest], raw: bytes
) -> ClientRequest:
    """``parse(raw)``: on the event loop, or for a body of ``LARGE_BODY_BYTES`` or more on a thread
    of its own (``Background.for_large``), the loop serving the others meanwhile."""
    if len(raw) < LARGE_BODY_BYTES:
        return parse(raw)
    return await background.for_large(_parsed_with_digests, parse, raw)


def _parsed_with_digests(parse: Callable[[bytes], ClientRequest], raw: bytes) -> ClientRequest:
    """The request, its tools' and system prompt's digests made too: the task's identity and the log
    record read them on the event loop, where encoding 20 MB of tools took 0.2 s."""
    req = parse(raw)
    req.tools_sha256()
    req.system_sha256()
    return req


def stopped(view: TaskView, decider: Decider, features: Features) -> AttemptStopped:
    """The error that refuses a call of an attempt the router stopped, saying what comes next: asked
    of the policy at the attempt's first refused call and kept with the task, so that every later
    call of the attempt and the outcome reply (``next``) say the same."""
    assert view.stopped is not None
    why, rule = view.stopped
    state = view.state
    if state.stop_next is None:
        state.stop_next = following.after_stop(decider, features)
    return AttemptStopped(
        following.told(why, state.stop_next),
        rule,
        state.stop_next,
        attempt=view.attempt,
        p_success=view.p_success,
    )


def _decider(
    rt: ActivePolicy, req: ClientRequest, task_id: str, key_id: str | None, headers: Mapping[str, str]
) -> tuple[str | None, Decider]:
    """The task's arm and the decider for it (the control arm's, a matching scope's, or the policy's)."""
    return rt.arm_for(task_id, scope_facts(req, headers, key_id) if rt.scopes else None)


def request_features(
    req: ClientRequest, prompt_tokens: int, headers: Mapping[str, str], task: TaskView | None = None,
    size: PromptSize | None = None, key_budget_left: float | None = None,
) -> Features:  # fmt: skip
    """The request's features; without ``task``, those of a fresh task's first request; ``size``:
    the measured prompt, whose anchored part is in its provider's tokens."""
    extra: dict[str, Any] = {"key_budget_left": key_budget_left}
    if task is not None:
        extra |= {
            "side_call": task.side_call, "task_vector": task.vector, "attempt": task.attempt,
            "failed_models": task.failed_models, "pinned": task.pinned, "switch_reason": task.switch_reason,
            "left_models": task.left_models,
            "signed_history": task.signed_history, "task_budget_left": task.budget_left,
            "warm_model": task.warm_model, "warm_tokens": task.warm_tokens, "warm_cached": task.warm_cached,
        }  # fmt: skip
    if size is not None:
        extra["prompt_anchor"], extra["anchor_model"] = size.provider_tokens, size.anchor_model
    new, reply, verb = turn_shape(req.messages)
    return Features(
        protocol=req.protocol,
        requested_model=req.model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=req.max_output_tokens,
        tools=bool(req.tools),
        n_tools=len(req.tools),
        thinking=req.thinking,
        vision=req.vision,
        unseen=req.unseen,
        stream=req.stream,
        n_messages=len(req.messages),
        headers=headers,
        # The shape of the turn and the program it ran price its output (the learned mean of its turn cell).
        turn_chars=(new, reply),
        turn_verb=verb,
        hosted_tools=declared(req.tools) if req.tools else (),
        hosted_max_uses=tuple(max_uses(req.tools, req.body.get("max_tool_calls")).items())
        if req.tools
        else (),
        **extra,
    )
