"""OpenAI Chat Completions client -> a backend that is not OpenAI-compatible (Anthropic, mostly).

litellm's own ``acompletion`` does the whole translation, tools and usage included; the glue here
only picks the fields to send, fills in ``max_tokens`` where the backend requires one, and writes
litellm's objects back as plain Chat Completions JSON (dropping litellm-only fields such as
``provider_specific_fields`` and ``thinking_blocks``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from router.forward.translate import streams
from router.forward.translate.litellm_setup import call_kwargs, default_max_tokens, get_litellm, route_of
from router.forward.translate.target import Target

#: Client fields litellm may translate for the backend (it drops what the backend cannot take).
#: ``store``, ``prompt_cache_key``, ``prediction`` and ``modalities`` mean nothing to a non-OpenAI
#: backend, and ``metadata`` would only reach litellm's own logging (its ``metadata`` argument).
_PASSED = (
    "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "temperature",
    "top_p", "max_tokens", "max_completion_tokens", "reasoning_effort", "stop", "seed", "user", "n",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "service_tier",
)  # fmt: skip
_DELTA_FIELDS = ("role", "content", "reasoning_content", "tool_calls", "refusal")
_MESSAGE_FIELDS = ("role", "content", "reasoning_content", "tool_calls", "refusal", "annotations")


def _request(body: dict[str, Any], target: Target) -> dict[str, Any]:
    kwargs = {key: body[key] for key in _PASSED if body.get(key) is not None}
    route = route_of(target.litellm_model)
    if route.anthropic_family and "max_tokens" not in kwargs and "max_completion_tokens" not in kwargs:
        # Anthropic requires max_tokens; litellm's own default for unknown models is far too large.
        kwargs["max_tokens"] = default_max_tokens(target)
    kwargs.update(call_kwargs(target))
    kwargs["model"] = target.litellm_model
    return kwargs


async def complete(body: dict[str, Any], target: Target) -> dict[str, Any]:
    litellm = get_litellm()
    deadline = streams.deadline_of(target)
    response = await streams.call(litellm.acompletion(**_request(body, target)), target, deadline)
    return completion_json(response)


async def open_stream(body: dict[str, Any], target: Target) -> AsyncIterator[bytes]:
    litellm = get_litellm()
    deadline = streams.deadline_of(target)
    kwargs = _request(body, target)
    # Always ask for usage: the router accounts for every call. The usage chunk (choices: [])
    # is always emitted too; router.forward.upstream hides it from clients that did not ask for it.
    kwargs["stream"] = True
    kwargs["stream_options"] = {"include_usage": True}
    upstream = await streams.call(litellm.acompletion(**kwargs), target, deadline)
    return streams.frames(upstream, target, deadline, _render, last=streams.DONE)


def _render(chunk: Any) -> bytes:
    return streams.data_frame(streams.dumps(chunk_json(chunk)))


def completion_json(response: Any) -> dict[str, Any]:
    """A litellm ModelResponse as a plain ``chat.completion`` object."""
    raw = response.model_dump(mode="json")
    choices = []
    for choice in raw.get("choices") or ():
        message = choice.get("message") or {}
        clean = {k: message[k] for k in _MESSAGE_FIELDS if message.get(k) is not None}
        clean.setdefault("role", "assistant")
        clean.setdefault("content", None)
        if "tool_calls" in clean:
            clean["tool_calls"] = [_tool_call(call, ("id", "type")) for call in clean["tool_calls"]]
        choices.append(
            {
                "index": choice.get("index", 0),
                "message": clean,
                "finish_reason": choice.get("finish_reason"),
                "logprobs": choice.get("logprobs"),
            }
        )
    out = {
        "id": raw.get("id"),
        "object": "chat.completion",
        "created": raw.get("created"),
        "model": raw.get("model"),
        "choices": choices,
    }
    if raw.get("system_fingerprint"):
        out["system_fingerprint"] = raw["system_fingerprint"]
    if raw.get("usage"):
        out["usage"] = _usage(raw["usage"])
    return out


def chunk_json(chunk: Any) -> dict[str, Any]:
    """A litellm ModelResponseStream as a plain ``chat.completion.chunk`` object."""
    raw = chunk.model_dump(mode="json")
    choices = []
    for choice in raw.get("choices") or ():
        delta = choice.get("delta") or {}
        clean = {k: delta[k] for k in _DELTA_FIELDS if delta.get(k) is not None}
        if "tool_calls" in clean:
            clean["tool_calls"] = [_tool_call(call, ("index", "id", "type")) for call in clean["tool_calls"]]
        choices.append(
            {"index": choice.get("index", 0), "delta": clean, "finish_reason": choice.get("finish_reason")}
        )
    out: dict[str, Any] = {
        "id": raw.get("id"),
        "object": "chat.completion.chunk",
        "created": raw.get("created"),
        "model": raw.get("model"),
        "choices": choices,
    }
    if raw.get("usage"):
        out["usage"] = _usage(raw["usage"])
    return out


def _tool_call(call: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    # A streamed call carries its index; a whole message's calls do not.
    out = {k: call[k] for k in keys if call.get(k) is not None}
    function = call.get("function") or {}
    out["function"] = {k: function[k] for k in ("name", "arguments") if function.get(k) is not None}
    return out


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Keep the counts, cache reads/writes and reasoning included; drop litellm's empty fields."""
    out: dict[str, Any] = {}
    for key, value in usage.items():
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
            if not value:
                continue
        if value is not None:
            out[key] = value
    return out
