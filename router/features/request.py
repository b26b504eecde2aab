"""Request → Features: the facts every routing decision is made from, built once per request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The features a policy's rules may name (``headers.<name>`` reads a request header, lower-case).
RULE_FIELDS = (
    "protocol",
    "requested_model",
    "prompt_tokens",
    "max_output_tokens",
    "tools",
    "n_tools",
    "thinking",
    "vision",
    "stream",
    "n_messages",
    "side_call",
)


@dataclass(frozen=True, slots=True)
class Features:
    protocol: str
    requested_model: str
    #: The prompt's estimate: ``prompt_anchor`` tokens counted by ``anchor_model``'s provider, the
    #: rest in o200k tokens (each backend's count: ``router.policy.estimates``).
    prompt_tokens: int
    #: What the client allows the reply to use, if it said.
    max_output_tokens: int | None
    tools: bool
    n_tools: int
    thinking: bool
    vision: bool
    stream: bool
    n_messages: int
    side_call: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    # The task's context (from ``router.features.task.context``; the defaults describe a fresh task).
    task_vector: Mapping[int, float] | None = None
    attempt: int = 1
    failed_models: tuple[str, ...] = ()
    #: The model this attempt is pinned to, if it has started.
    pinned: str | None = None
    #: Why the pinned model should be left (a loop, repeated tool failures), if anything says so.
    switch_reason: str | None = None
    #: The history carries provider-signed state (thinking signatures, encrypted reasoning) that
    #: only this protocol family's pinned backend may receive back.
    signed_history: str | None = None
    #: What is left of the task's budget, and of the calling key's, after the money held in flight.
    task_budget_left: float | None = None
    key_budget_left: float | None = None
    #: The backend holding this task's warm prompt prefix, and how many tokens of it.
    warm_model: str | None = None
    warm_tokens: int = 0
    #: The part of ``prompt_tokens`` in ``anchor_model``'s provider tokens (the rest is o200k);
    #: None: the whole estimate is taken as any backend's count (nothing is converted).
    prompt_anchor: int | None = None
    anchor_model: str | None = None
    #: Characters of what the model is answering (the items after its last turn) and of that
    #: last turn (None: it has not spoken yet); None: not measured. The expected output reads them.
    turn_chars: tuple[int, int | None] | None = None

    def for_rules(self) -> dict[str, Any]:
        """The mapping that rule conditions read (names as in the policy file)."""
        facts: dict[str, Any] = {name: getattr(self, name) for name in RULE_FIELDS}
        facts["headers"] = self.headers
        return facts


def _is_model_item(item: Any) -> bool:
    """A turn the model wrote: an assistant message (Chat, Messages) or a Responses output item."""
    if not isinstance(item, dict):
        return False
    return item.get("role") == "assistant" or item.get("type") in ("function_call", "reasoning")


def turn_chars(messages: Sequence[Any]) -> tuple[int, int | None]:
    """(characters of the items after the model's last turn, characters of that turn or None).

    What an agent's next reply length follows: a short tool result (an edit went through) gets a
    short reply, a long one (a file was read) a longer one, and a long last reply (a script was
    written) is often followed by another. Only the tail is read: it costs the same on any history.
    """
    if not isinstance(messages, list):
        # As PromptSizer.measure takes it: one item (a string walked as a sequence is one call a character).
        messages = [messages]
    new, k = 0, len(messages) - 1
    while k >= 0 and not _is_model_item(messages[k]):
        new += _chars(messages[k])
        k -= 1
    if k < 0:
        return new, None
    reply = 0
    while k >= 0 and _is_model_item(messages[k]):
        reply += _chars(messages[k])
        k -= 1
    return new, reply


def _chars(item: Any) -> int:
    # Chat's messages are measured as they are: joining their text as the token counter does
    # (tool calls dumped to JSON) cost a fifth of the memo's whole measure of a request.
    if isinstance(item, dict):
        content, calls = item.get("content"), item.get("tool_calls")
        if isinstance(content, str) and not calls:
            return len(content)
        if (
            (content is None or isinstance(content, str))
            and isinstance(calls, list)
            and all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
        ):
            fns = [c["function"] for c in calls]
            return len(content or "") + sum(
                len(str(f.get("name") or "")) + len(str(f.get("arguments") or "")) for f in fns
            )
    from router.features.tokens import item_text  # tiktoken loads with the counter, not with Features

    return len(item_text(item)[1])
