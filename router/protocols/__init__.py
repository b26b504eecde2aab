"""The client-facing wire protocols, one module each, behind one small table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from router.errors import RouterError
from router.protocols import anthropic, openai_chat, responses
from router.protocols.common import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, ClientRequest, Usage


class StreamObserver(Protocol):
    usage: Usage
    done: bool
    #: The message of an error event the backend sent in the stream (the client has it already).
    error: str | None
    #: What the content events carried (their deltas, as parsed): a stream cut before its usage
    #: is charged for it, tokenized (``accounting.streamed_tokens``), not per event.
    written: list[Any]

    def observe(self, event: str | None, data: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class Wire:
    name: str
    parse: Callable[[bytes], ClientRequest]
    usage_from: Callable[[dict[str, Any]], Usage]
    observer: Callable[[], StreamObserver]
    error_frame: Callable[[RouterError], bytes]
    error_body: Callable[[RouterError], dict[str, Any]]
    #: Appended to a backend's api_base to relay this protocol (litellm's api_base conventions).
    path: str
    #: The router's own endpoint for clients of this protocol.
    endpoint: str


def _openai_body(err: RouterError) -> dict[str, Any]:
    return err.openai_body()  # the error's own (an ``AttemptStopped`` adds ``next``), not the base's


def _anthropic_body(err: RouterError) -> dict[str, Any]:
    return err.anthropic_body()


WIRES: dict[str, Wire] = {
    OPENAI_CHAT: Wire(
        OPENAI_CHAT, openai_chat.parse, openai_chat.usage_from, openai_chat.StreamObserver,
        openai_chat.error_frame, _openai_body, "/chat/completions", "/v1/chat/completions",
    ),
    ANTHROPIC: Wire(
        ANTHROPIC, anthropic.parse, anthropic.usage_from, anthropic.StreamObserver,
        anthropic.error_frame, _anthropic_body, "/v1/messages", "/v1/messages",
    ),
    OPENAI_RESPONSES: Wire(
        OPENAI_RESPONSES, responses.parse, responses.usage_from, responses.StreamObserver,
        responses.error_frame, _openai_body, "/responses", "/v1/responses",
    ),
}  # fmt: skip

#: The proxied endpoints: path → client protocol.
PROXIED: Mapping[str, str] = {w.endpoint: w.name for w in WIRES.values()}

__all__ = [
    "ANTHROPIC",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROXIED",
    "WIRES",
    "ClientRequest",
    "Usage",
    "Wire",
]
