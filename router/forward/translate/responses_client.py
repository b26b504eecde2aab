"""OpenAI Responses client -> a Chat Completions or Anthropic backend.

litellm's Responses-to-completion bridge (``responses/litellm_completion_transformation``) does
the work, entered through ``litellm.aresponses(..., use_chat_completions_api=True)`` so that an
``openai/`` backend is sent Chat Completions, never the Responses API it may not have. The bridge
translates input items (messages, function calls and outputs), tools, ``reasoning`` and ``text``,
and its stream iterator emits the Responses event sequence with sequence numbers, ending in
``response.completed`` with usage. Glue written here:

* ``reasoning`` input items are removed unless the backend is sent Anthropic bodies, the request
  asks for reasoning and the item carries signed thinking blocks (which litellm itself encoded
  when an Anthropic backend produced them): a chat backend would get them as
  ``reasoning_content``, which some reject, and Anthropic rejects thinking history in a request
  without thinking;
* ``include``, ``truncation``, ``metadata`` and ``client_metadata`` are not passed (no chat
  meaning; litellm's ``metadata`` is its own logging channel);
* ``previous_response_id`` is refused: nothing stores the earlier turns for a translated backend;
* ``max_output_tokens`` is filled for Anthropic backends (required there; litellm's default for an
  unknown model exceeds what real models take).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from router.errors import BadRequest
from router.forward.translate import streams
from router.forward.translate.litellm_setup import call_kwargs, default_max_tokens, get_litellm, route_of
from router.forward.translate.target import Target

_PASSED = (
    "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "max_output_tokens",
    "temperature", "top_p", "text", "store", "prompt_cache_key", "user", "service_tier",
    "safety_identifier",
)  # fmt: skip


def _request(body: dict[str, Any], target: Target) -> dict[str, Any]:
    if body.get("previous_response_id"):
        raise BadRequest(
            "previous_response_id cannot be served by this backend: send the full conversation as input",
            param="previous_response_id",
        )
    route = route_of(target.litellm_model)
    kwargs = {key: body[key] for key in _PASSED if body.get(key) is not None}
    keep_thinking = route.anthropic_family and _wants_reasoning(body)
    kwargs["input"] = _input_for(body.get("input", ""), keep_thinking)
    if route.anthropic_family and "max_output_tokens" not in kwargs:
        kwargs["max_output_tokens"] = default_max_tokens(target)
    kwargs.update(call_kwargs(target))
    kwargs["model"] = target.litellm_model
    kwargs["use_chat_completions_api"] = True
    return kwargs


def _wants_reasoning(body: dict[str, Any]) -> bool:
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    return isinstance(effort, str) and effort != "none"


def _input_for(items: Any, keep_thinking: bool) -> Any:
    """Drop reasoning items, except signed Anthropic thinking when the request thinks too
    (Anthropic rejects thinking blocks in the history of a request without thinking)."""
    if not isinstance(items, list):
        return items
    return [
        item
        for item in items
        if not (isinstance(item, dict) and item.get("type") == "reasoning")
        or (keep_thinking and _carries_signed_thinking(item))
    ]


def _carries_signed_thinking(item: dict[str, Any]) -> bool:
    from litellm.responses.litellm_completion_transformation.transformation import (
        LiteLLMCompletionResponsesConfig,
    )

    try:
        return LiteLLMCompletionResponsesConfig._decode_thinking_blocks_from_input_item(item) is not None
    except Exception:
        return False


async def complete(body: dict[str, Any], target: Target) -> dict[str, Any]:
    litellm = get_litellm()
    deadline = streams.deadline_of(target)
    kwargs = _request(body, target)
    kwargs["stream"] = False
    response = await streams.call(litellm.aresponses(**kwargs), target, deadline)
    out: dict[str, Any] = response.model_dump(mode="json", exclude_none=True)
    return out


async def open_stream(body: dict[str, Any], target: Target) -> AsyncIterator[bytes]:
    litellm = get_litellm()
    deadline = streams.deadline_of(target)
    kwargs = _request(body, target)
    kwargs["stream"] = True
    events = await streams.call(litellm.aresponses(**kwargs), target, deadline)
    return streams.frames(events, target, deadline, _render)


def _render(event: Any) -> bytes:
    payload = event.model_dump(mode="json", exclude_none=True)
    return streams.event_frame(str(payload.get("type")), streams.dumps(payload))
