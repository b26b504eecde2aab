"""Cross-protocol calls through litellm, for backends that do not speak the client's protocol.

Same-protocol traffic never comes here: it is relayed byte for byte (``router.forward.upstream``). Each
client protocol has one small module that turns the client's body into a litellm call and the
reply (or stream) back into the client's wire format:

* ``chat_client``      OpenAI Chat Completions client -> Anthropic (or any litellm chat) backend
* ``anthropic_client`` Anthropic Messages client -> OpenAI-protocol backend
* ``responses_client`` OpenAI Responses client -> Chat Completions or Anthropic backend

Every failure surfaces as a ``router.errors`` type (see ``upstream_errors``): from ``complete``;
from ``open_stream`` until the upstream has answered; from the frame iterator after that. A
request litellm could not convert is ``Untranslatable``: a 400 once no other candidate took it
(``router.forward.execute``), naming the field where the client's protocol module says which
(``untranslatable``), else the backend and litellm's error type.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

from router.errors import BadRequest, RouterError, Untranslatable
from router.forward.translate import anthropic_client, chat_client, responses_client
from router.forward.translate.target import Target
from router.forward.translate.upstream_errors import converting, root_error, to_router_error
from router.protocols import openai_chat, responses

__all__ = ["Target", "complete", "open_stream"]

_CLIENTS: dict[str, ModuleType] = {
    "openai_chat": chat_client,
    "anthropic": anthropic_client,
    "openai_responses": responses_client,
}


#: Per client protocol, what of a request the translation to another family cannot carry.
_UNTRANSLATABLE: dict[str, Callable[[dict[str, Any]], tuple[str, str] | None]] = {
    "openai_chat": openai_chat.untranslatable,
    "openai_responses": responses.untranslatable,
}


def _client(client_protocol: str) -> ModuleType:
    try:
        return _CLIENTS[client_protocol]
    except KeyError:
        raise BadRequest(f"no translation for client protocol {client_protocol!r}") from None


async def complete(client_protocol: str, body: dict[str, Any], target: Target) -> dict[str, Any]:
    """One non-streamed call; the reply is in the client's protocol, usage included."""
    client = _client(client_protocol)
    try:
        result: dict[str, Any] = await client.complete(body, target)
    except Exception as exc:  # a translation bug here must still reach the caller as a RouterError
        raise _failure(exc, client_protocol, body, target) from None
    return result


async def open_stream(client_protocol: str, body: dict[str, Any], target: Target) -> AsyncIterator[bytes]:
    """Start a streamed call; returns once the upstream has answered, yielding whole SSE frames."""
    client = _client(client_protocol)
    try:
        frames: AsyncIterator[bytes] = await client.open_stream(body, target)
    except Exception as exc:
        raise _failure(exc, client_protocol, body, target) from None
    return frames


def _failure(exc: Exception, client_protocol: str, body: dict[str, Any], target: Target) -> RouterError:
    """The error of a failed call: the request's own when litellm failed to convert it, naming its
    field where the client's protocol module says which it cannot have carried. A conversion
    failure no module names is the request's all the same: litellm raised before any call, so
    another try of the backend fails alike and says nothing of its health (as a 502 it counted as
    the router's failure and, asked of one backend, read as an outage to the client)."""
    if not converting(exc):
        return to_router_error(exc, target)
    provider = target.litellm_model.split("/", 1)[0]
    check = _UNTRANSLATABLE.get(client_protocol)
    found = check(body) if check is not None else None
    if found is None:
        # litellm's own text is not quoted: its conversion errors carry the message they failed on.
        return Untranslatable(
            f"invalid request: the request cannot be translated for backend {target.backend!r} ({provider}): "
            f"litellm could not convert it ({root_error(exc)})"
        )
    what, param = found
    return Untranslatable(
        f"invalid request: {what} cannot be translated for backend {target.backend!r} ({provider})",
        param=param,
    )


async def warm_up() -> None:
    """Run litellm's call path once without a network call (``mock_response``).

    Its first call in a process imports and builds a good deal lazily (a quarter of a second
    here); paying that at startup keeps it off some agent's first cross-protocol request.
    """
    from router.forward.translate.litellm_setup import get_litellm

    with contextlib.suppress(Exception):  # a warm-up must never stop the router from starting
        await get_litellm().acompletion(
            model="openai/warm-up", messages=[{"role": "user", "content": "."}], mock_response="."
        )
