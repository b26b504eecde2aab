"""Cross-protocol calls through litellm, for backends that do not speak the client's protocol.

Same-protocol traffic never comes here: it is relayed byte for byte (``router.upstream``). Each
client protocol has one small module that turns the client's body into a litellm call and the
reply (or stream) back into the client's wire format:

* ``chat_client``      OpenAI Chat Completions client -> Anthropic (or any litellm chat) backend
* ``anthropic_client`` Anthropic Messages client -> OpenAI-protocol backend
* ``responses_client`` OpenAI Responses client -> Chat Completions or Anthropic backend

Failures surface as ``router.errors`` types (see ``upstream_errors``); a stream raises them from
``open_stream`` until the upstream answered, and from the iterator after that.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from router.errors import BadRequest
from router.translate import anthropic_client, chat_client, responses_client
from router.translate.target import Target

__all__ = ["Target", "complete", "open_stream"]

_CLIENTS: dict[str, ModuleType] = {
    "openai_chat": chat_client,
    "anthropic": anthropic_client,
    "openai_responses": responses_client,
}


def _client(client_protocol: str) -> ModuleType:
    try:
        return _CLIENTS[client_protocol]
    except KeyError:
        raise BadRequest(f"no translation for client protocol {client_protocol!r}") from None


async def complete(client_protocol: str, body: dict[str, Any], target: Target) -> dict[str, Any]:
    """One non-streamed call; the reply is in the client's protocol, usage included."""
    result: dict[str, Any] = await _client(client_protocol).complete(body, target)
    return result


async def open_stream(client_protocol: str, body: dict[str, Any], target: Target) -> AsyncIterator[bytes]:
    """Start a streamed call; returns once the upstream has answered, yielding whole SSE frames."""
    stream: AsyncIterator[bytes] = await _client(client_protocol).open_stream(body, target)
    return stream
