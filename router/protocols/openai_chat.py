"""OpenAI Chat Completions: request validation, usage, stream observation, error frames."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from router.errors import BadRequest, RouterError
from router.protocols.common import (
    OPENAI_CHAT,
    ClientRequest,
    Flag,
    MaxTokens,
    PartKinds,
    Usage,
    allow,
    check_messages,
    check_parts,
    check_service_tier,
    error_message,
    event_json,
    first_user_text,
    has_image,
    load_body,
    not_json,
    one_hour_writes,
    scan_messages,
    shown,
    text_of,
    validated,
)
from router.protocols.fetched import names_unseen
from router.protocols.pausedgc import collector_paused
from router.protocols.toolschema import check_schema

#: Fields a provider may receive. Anything else a client sends is dropped, never forwarded.
ALLOWED = frozenset(
    {
        "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
        "temperature", "top_p", "max_tokens", "max_completion_tokens", "reasoning_effort", "stop",
        "seed", "user", "stream", "stream_options", "n", "presence_penalty", "frequency_penalty",
        "logit_bias", "logprobs", "top_logprobs", "prediction", "modalities", "service_tier",
        "prompt_cache_key", "verbosity", "metadata", "store",
    }
)  # fmt: skip


ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1, max_length=256)]
    parameters: dict[str, Any] | None = None


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Annotated[str, Field(min_length=1)] = "function"
    function: _Function | None = None


#: Content part types of Chat Completions messages, and what each must carry. Another type, or
#: a part without its field, reached the backend: a 200 that ignored it, or a 500 from translation.
PART_TYPES: PartKinds = {
    "text": ("text", str),
    "image_url": ("image_url", (dict, str)),
    "input_audio": ("input_audio", dict),
    "file": ("file", dict),
    "refusal": ("refusal", str),
}


#: The part types a user message may have (OpenAI's ChatCompletionContentPartParam).
_USER_PARTS = frozenset({"text", "image_url", "input_audio", "file"})


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Annotated[str, Field(min_length=1, max_length=256)]
    # Checked by hand (check_messages): the longest part of every agent request.
    messages: list[Any]
    stream: Flag | None = False
    tools: list[_Tool] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    reasoning_effort: str | None = None
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, Field(ge=1, le=1, strict=True)] | None = None


@collector_paused
def parse(raw: bytes) -> ClientRequest:
    body, encoded = load_body(raw)
    req = validated(_Request, body)
    check_service_tier(body.get("service_tier"))
    scanned = scan_messages(body["messages"], ROLES, content_optional=True, kinds=PART_TYPES)
    if scanned is None:
        check_messages(body["messages"], ROLES, content_optional=True)
        check_parts(body["messages"], PART_TYPES, "messages")
        vision = any(has_image(m.get("content")) for m in body["messages"])
    else:
        vision = scanned[0]
    messages = body["messages"]
    system = _read_messages(messages)
    for i, tool in enumerate(req.tools or ()):
        if tool.type == "function":
            if tool.function is None:
                raise BadRequest(f"tools[{i}].function: a function tool needs its function", param="tools")
            if tool.function.parameters is not None:
                check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    return ClientRequest(
        protocol=OPENAI_CHAT,
        encoded=encoded,
        body=allow(body, ALLOWED),
        model=req.model,
        stream=bool(req.stream),
        messages=messages,
        system=system or None,
        tools=body.get("tools") or [],
        max_output_tokens=_larger(req.max_completion_tokens, req.max_tokens),
        temperature=req.temperature,
        top_p=req.top_p,
        reasoning_effort=req.reasoning_effort,
        thinking=req.reasoning_effort not in (None, "none", "minimal"),
        vision=vision,
        unseen=names_unseen(encoded.get("messages")),
        first_user_text=first_user_text(messages),
        system_text="\n".join(text_of(content) for content in system),
        session_hint=body.get("prompt_cache_key") if isinstance(body.get("prompt_cache_key"), str) else None,
        include_usage=bool((req.stream_options or {}).get("include_usage")),
    )


def _larger(a: int | None, b: int | None) -> int | None:
    """The output limit of a request that may give two: both are forwarded, and a backend may obey
    either (some read only ``max_tokens``), so the budget's hold is sized by the larger."""
    return a if b is None else b if a is None else max(a, b)


def usage_from(obj: dict[str, Any]) -> Usage:
    """Usage of a chat.completion object or of a stream's usage chunk."""
    u = obj.get("usage") or {}
    details = u.get("prompt_tokens_details") or {}
    out_details = u.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=u.get("prompt_tokens"),
        output_tokens=u.get("completion_tokens"),
        cache_read_tokens=details.get("cached_tokens"),
        # OpenAI-compatible providers that report writes (DeepSeek, litellm-translated Anthropic)
        cache_write_tokens=u.get("cache_creation_input_tokens") or details.get("cache_creation_tokens"),
        # litellm's translation of Anthropic's usage keeps its one-hour writes here.
        cache_write_1h_tokens=one_hour_writes(details.get("cache_creation_token_details")),
        reasoning_tokens=out_details.get("reasoning_tokens"),
        provider_model=obj.get("model"),
        response_id=obj.get("id"),
        finish_reasons=[c["finish_reason"] for c in obj.get("choices") or () if c.get("finish_reason")],
    )


class StreamObserver:
    """Reads the chunks of a chat stream as they pass: content events, usage, the model."""

    def __init__(self) -> None:
        self.usage = Usage()
        #: The stream's terminal event has been seen (a stream that ends without it was cut short).
        self.done = False
        self.error: str | None = None
        self.written: list[Any] = []

    def observe(self, event: str | None, data: bytes) -> bool:
        """Return whether this frame carries content (a token of text, tool call or reasoning)."""
        if data == b"[DONE]":
            self.done = True
            return False
        if not data:
            return False  # a comment or keep-alive
        chunk = event_json(data)
        if not isinstance(chunk, dict):
            return False
        if (said := chunk.get("error")) is not None:
            self.error = error_message(said)
            return False
        u = self.usage
        if u.provider_model is None and chunk.get("model"):
            u.provider_model = chunk["model"]
        if u.response_id is None and chunk.get("id"):
            u.response_id = chunk["id"]
        if chunk.get("usage"):
            self.usage = usage_from(chunk)
            self.usage.provider_model, self.usage.response_id = u.provider_model, u.response_id
            self.usage.finish_reasons = u.finish_reasons
        content = False
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                self.usage.finish_reasons.append(choice["finish_reason"])
            delta = choice.get("delta") or {}
            # "reasoning" is what OpenAI-compatible servers (vLLM, OpenRouter, Groq) call DeepSeek's
            # reasoning_content: a stream cut while a model thought is charged for the thought.
            if (
                delta.get("content")
                or delta.get("tool_calls")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
                or delta.get("refusal")
            ):
                content = True
                self.written.append(delta)
        return content


def is_usage_only(data: bytes) -> bool:
    """The final usage chunk (``choices: []``), hidden from clients that did not ask for it."""
    # Streams that report usage send "usage":null on every other chunk (OpenAI writes compact
    # JSON; a quote inside a string is escaped, so text cannot fake this): no need to parse those.
    # (``find``, not ``in``: see ``sse.parse_block``.)
    if data.find(b'"usage"') < 0 or data.find(b'"usage":null') >= 0:
        return False
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and not chunk.get("choices") and bool(chunk.get("usage"))


def usage_frame_with_cost(data: bytes, cost_usd: float) -> bytes:
    """The final usage chunk as an SSE frame with ``usage.cost`` (USD) added, where OpenRouter puts
    it: clients such as aider read the cost of the call there instead of pricing it themselves."""
    chunk = orjson.loads(data)
    chunk["usage"]["cost"] = cost_usd
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def error_frame(err: RouterError) -> bytes:
    return b"data: " + orjson.dumps(err.openai_body()) + b"\n\n"


def _read_messages(messages: list[dict[str, Any]]) -> list[Any]:
    """The system prompt's contents (system and developer messages), read in the walk that checks
    what translation to another family (litellm's) reads and the shape checks leave open:
    forwarded, a ``tool_calls`` of a number or a user message of no content failed in litellm (a
    TypeError or KeyError, a 502 after every backend was tried). One walk, not two: a long agent
    conversation passes here on every request."""
    system = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _bad_calls(i)
            for c in calls:
                if not isinstance(c, dict):
                    raise _bad_calls(i)
        role = m.get("role")
        content = m.get("content")
        if content is None and role not in ("assistant", "function"):
            raise BadRequest(
                f"invalid request: messages.{i}.content: required for a {m['role']} message", param="messages"
            )
        if role in ("system", "developer"):
            system.append(content)
    return system


def _bad_calls(i: int) -> BadRequest:
    return BadRequest(
        f"invalid request: messages.{i}.tool_calls: must be a list of tool calls", param="messages"
    )


def untranslatable(body: dict[str, Any]) -> tuple[str, str] | None:
    """What of a Chat request its translation to another family (litellm's) cannot carry, as the
    field and what is wrong with it, and the ``param`` that names it: a tool call's arguments that
    are not JSON (the call's input is read from them: a ValueError), or a tool of a type other
    than function (litellm knows Anthropic's own types too; another is a ValueError, a "custom"
    tool a KeyError), or a part a user turn cannot have (a refusal, the assistant's: litellm
    checks every user turn's part types). Read once a translation has failed: checked up front, it
    would refuse what litellm does translate (arguments cut short, which it repairs; Anthropic's
    tool types)."""
    for i, m in enumerate(body.get("messages") or ()):
        content = m.get("content") if isinstance(m, dict) and m.get("role") == "user" else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _USER_PARTS:
                return f"messages.{i}.content.{j}: a part of type {shown(kind)} in a user message", "messages"
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and not_json(function.get("arguments")):
                return (
                    f"messages.{i}.tool_calls.{j}.function.arguments: arguments that are not JSON text",
                    "messages",
                )
    for i, tool in enumerate(body.get("tools") or ()):
        kind = tool.get("type", "function") if isinstance(tool, dict) else None
        if kind != "function":
            return f"tools.{i}.type: a tool of type {shown(kind)}", "tools"
    return None
