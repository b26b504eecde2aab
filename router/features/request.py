"""Request → Features: the pure, cheap facts every routing decision is made from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from router.features.tokens import TokenCounter
from router.protocols.common import ANTHROPIC, OPENAI_CHAT, ClientRequest


@dataclass(slots=True)
class Features:
    protocol: str
    requested_model: str
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
    # Task context (set by the proxy from the task tracker; defaults describe a fresh task).
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
    task_budget_left: float | None = None
    #: The backend holding this task's warm prompt prefix, and how many tokens of it.
    warm_model: str | None = None
    warm_tokens: int = 0

    def for_rules(self) -> dict[str, Any]:
        """The mapping that rule conditions read (names as in the policy file)."""
        return {
            "protocol": self.protocol,
            "requested_model": self.requested_model,
            "prompt_tokens": self.prompt_tokens,
            "max_output_tokens": self.max_output_tokens,
            "tools": self.tools,
            "n_tools": self.n_tools,
            "thinking": self.thinking,
            "vision": self.vision,
            "stream": self.stream,
            "n_messages": self.n_messages,
            "side_call": self.side_call,
            "headers": self.headers,
        }


def count_prompt_tokens(req: ClientRequest, counter: TokenCounter) -> int:
    if req.protocol == OPENAI_CHAT:
        return counter.count_openai_chat(req.messages, req.tools or None)
    if req.protocol == ANTHROPIC:
        return counter.count_anthropic(req.system, req.messages, req.tools or None)
    return counter.count_responses(req.system, req.messages, req.tools or None)


def extract(req: ClientRequest, counter: TokenCounter, headers: Mapping[str, str]) -> Features:
    """Features with the prompt counted exactly."""
    return of(req, count_prompt_tokens(req, counter), headers)


def of(req: ClientRequest, prompt_tokens: int, headers: Mapping[str, str]) -> Features:
    """Features of a request whose prompt size is already known (or estimated: ``router.features.promptsize``)."""
    return Features(
        protocol=req.protocol,
        requested_model=req.model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=req.max_output_tokens,
        tools=bool(req.tools),
        n_tools=len(req.tools),
        thinking=req.thinking,
        vision=req.vision,
        stream=req.stream,
        n_messages=len(req.messages),
        headers=headers,
    )
