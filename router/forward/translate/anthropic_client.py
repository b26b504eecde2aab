"""Anthropic Messages client -> an OpenAI-protocol backend.

litellm's Messages adapter (``llms/anthropic/messages/adapters``) does the translation: request
(``AnthropicAdapter``), reply (``LiteLLMAnthropicMessagesAdapter``) and stream
(``AnthropicStreamWrapper``). Its top-level entry, ``litellm.anthropic_messages``, is not used
because for OpenAI models with ``thinking`` it re-routes the call to OpenAI's Responses API (a
chat-only backend has none) and it runs a ``context_management`` polyfill that may call another
model. Glue written here, because the adapter gets these wrong for a chat backend:

* ``thinking``/``redacted_thinking`` history blocks are removed: the adapter turns them into
  ``thinking_blocks`` and ``reasoning_content`` message fields, which reach the backend;
* ``cache_control`` marks are removed (the adapter keeps them for model names containing
  "claude" or "gemini", and litellm keeps them for custom API bases);
* ``metadata`` (user id), ``context_management``, ``service_tier`` and ``top_k`` are not sent;
* ``thinking: disabled`` sends nothing rather than ``reasoning_effort: "none"``;
* ``tool_choice.disable_parallel_tool_use`` becomes ``parallel_tool_calls: false``.

Backends that are themselves sent Anthropic bodies (Bedrock or Vertex Claude) keep thinking blocks
and cache marks.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from router.forward.translate import streams
from router.forward.translate.litellm_setup import ProviderRoute, call_kwargs, get_litellm, route_of
from router.forward.translate.target import Target

#: Anthropic request fields the adapter translates. ``output_config`` is consumed by it
#: (``format`` -> ``response_format``, adaptive ``effort`` -> ``reasoning_effort``), never sent raw.
_PASSED = (
    "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "tools",
    "tool_choice", "thinking", "output_config", "output_format",
)  # fmt: skip
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _request(body: dict[str, Any], target: Target) -> tuple[dict[str, Any], dict[str, str]]:
    get_litellm()
    from litellm.llms.anthropic.messages.adapters.transformation import AnthropicAdapter

    route = route_of(target.litellm_model)
    anthropic = {key: body[key] for key in _PASSED if body.get(key) is not None}
    anthropic["model"] = target.litellm_model
    if route.anthropic_family:
        if body.get("top_k") is not None:
            anthropic["top_k"] = body["top_k"]
    else:
        anthropic["messages"] = [_plain_message(m) for m in anthropic["messages"]]
        anthropic["messages"] = [m for m in anthropic["messages"] if m.get("content") not in ([], "")]
        for key in ("system", "tools"):
            if isinstance(anthropic.get(key), list):
                anthropic[key] = [_without_cache_control(block) for block in anthropic[key]]
    thinking = anthropic.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        del anthropic["thinking"]
    openai_request, tool_names = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
        anthropic, custom_llm_provider=route.provider, api_base=target.api_base, drop_params=True
    )
    if openai_request is None:
        raise ValueError("the Anthropic request could not be translated")
    request: dict[str, Any] = dict(openai_request)
    _fit_reasoning_effort(request, route)
    tool_choice = body.get("tool_choice")
    if (
        isinstance(tool_choice, dict)
        and tool_choice.get("disable_parallel_tool_use")
        and request.get("tools")
    ):
        request["parallel_tool_calls"] = False
    request.update(call_kwargs(target))
    request["model"] = target.litellm_model
    return request, tool_names


def _plain_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [_without_cache_control(b) for b in content if not _is_thinking(b)]
    return {**message, "content": blocks}


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in _THINKING_BLOCKS


def _without_cache_control(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):  # tool_result blocks nest content blocks
        out["content"] = [_without_cache_control(b) for b in out["content"]]
    return out


def _fit_reasoning_effort(request: dict[str, Any], route: ProviderRoute) -> None:
    """Chat backends take a plain effort string the model supports (e.g. no "max" for o-series)."""
    effort = request.get("reasoning_effort")
    if isinstance(effort, dict):
        effort = effort.get("effort")
    if not isinstance(effort, str):
        request.pop("reasoning_effort", None)
        return
    from litellm.llms.anthropic.messages.utils import normalize_reasoning_effort_value

    # An unknown model keeps the tier the client asked for.
    with contextlib.suppress(Exception):
        effort = normalize_reasoning_effort_value(
            effort, model=route.model, custom_llm_provider=route.provider
        )
    request["reasoning_effort"] = effort


async def complete(body: dict[str, Any], target: Target) -> dict[str, Any]:
    litellm = get_litellm()
    from litellm.llms.anthropic.messages.adapters.transformation import LiteLLMAnthropicMessagesAdapter

    deadline = streams.deadline_of(target)
    request, tool_names = _request(body, target)
    response = await streams.call(litellm.acompletion(**request), target, deadline)
    message = LiteLLMAnthropicMessagesAdapter().translate_openai_response_to_anthropic(
        response=response, tool_name_mapping=tool_names
    )
    out: dict[str, Any] = streams.plain(message)
    if out.get("stop_details") is None:
        out.pop("stop_details", None)
    return out


async def open_stream(body: dict[str, Any], target: Target) -> AsyncIterator[bytes]:
    litellm = get_litellm()
    from litellm.llms.anthropic.messages.adapters.streaming_iterator import AnthropicStreamWrapper

    deadline = streams.deadline_of(target)
    request, tool_names = _request(body, target)
    request["stream"] = True
    request["stream_options"] = {"include_usage": True}
    upstream = await streams.call(litellm.acompletion(**request), target, deadline)
    # Iterating the wrapper itself (not its SSE helper) lets mid-stream errors raise instead of
    # turning into an error event here: the caller writes the one protocol error event.
    events = AnthropicStreamWrapper(
        completion_stream=upstream, model=route_of(target.litellm_model).model, tool_name_mapping=tool_names
    )
    return streams.frames(events, target, deadline, _render)


def _render(event: Any) -> bytes | None:
    if not isinstance(event, dict):
        return None
    return streams.event_frame(str(event.get("type", "message")), streams.dumps(event))
