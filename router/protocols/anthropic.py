"""Anthropic Messages: request validation, usage, stream observation, error events."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from router.errors import BadRequest, RouterError
from router.protocols.common import (
    ANTHROPIC,
    ClientRequest,
    Flag,
    MaxTokens,
    PartKinds,
    Usage,
    allow,
    check_messages,
    check_parts,
    error_message,
    event_json,
    first_user_text,
    has_image,
    load_body,
    one_hour_writes,
    scan_messages,
    text_of,
    validated,
)
from router.protocols.fetched import names_unseen
from router.protocols.hosted import anthropic_calls, block_call, block_kind, counted, most, reported_calls
from router.protocols.pausedgc import collector_paused
from router.protocols.toolschema import check_schema

#: Fields a provider may receive. ``context_management`` and ``output_config`` are what Claude
#: Code sends with beta headers; ``mcp_servers`` is left out on purpose: it makes the provider
#: connect to URLs the client chose.
ALLOWED = frozenset(
    {
        "model", "messages", "system", "max_tokens", "metadata", "stop_sequences", "stream",
        "temperature", "top_p", "top_k", "tools", "tool_choice", "thinking", "service_tier",
        "context_management", "output_config",
    }
)  # fmt: skip


#: "system" mid-conversation comes with Claude Code's mid-conversation-system beta (and newer
#: models take it): never as the first message, which is what the top-level ``system`` is for.
ROLES = frozenset({"user", "assistant", "system"})

#: The content block types a request may carry (the SDK's ``BetaContentBlockParam``, which holds
#: every ``ContentBlockParam``; ``tests/unit/test_protocols.py`` checks the installed SDK's).
#: Another type is refused here, naming where it is: forwarded, it came back as some backend's
#: unrelated complaint ("messages: expected a non-empty array" from a translated call).
BLOCK_TYPES: PartKinds = {
    **dict.fromkeys((
        "document", "search_result", "thinking", "redacted_thinking",
        "tool_result", "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
        "advisor_tool_result", "code_execution_tool_result", "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result", "tool_search_tool_result", "mcp_tool_use",
        "mcp_tool_result", "mcp_tool_listing", "container_upload", "compaction", "mid_conv_system",
        "tool_addition", "tool_removal", "fallback",
    )),
    "text": ("text", str),
    "image": ("source", dict),
    # A nameless call failed in translation to another family (a TypeError, a 502).
    "tool_use": ("name", str),
}  # fmt: skip


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1, max_length=256)]
    input_schema: dict[str, Any] | None = None


class _Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    # Bounded like max_tokens: the log keeps it, and 2**64 - 1 made a served request's row one the
    # store refused (64 bits), its spend then missing from the ledgers and the budgets read back.
    budget_tokens: MaxTokens | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Annotated[str, Field(min_length=1, max_length=256)]
    # Checked by hand (check_messages): the longest part of every agent request.
    messages: list[Any]
    max_tokens: MaxTokens
    system: str | list[dict[str, Any]] | None = None
    stream: Flag | None = False
    tools: list[_Tool] | None = None
    temperature: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    thinking: _Thinking | None = None
    metadata: dict[str, Any] | None = None


@collector_paused
def parse(raw: bytes, *, count_only: bool = False) -> ClientRequest:
    body, encoded = load_body(raw)
    if count_only and "max_tokens" not in body:
        body = {**body, "max_tokens": 1}
    req = validated(_Request, body)
    scanned = scan_messages(body["messages"], ROLES, content_optional=False, kinds=BLOCK_TYPES)
    signed = None
    if scanned is None or body["messages"][0].get("role") == "system":
        check_messages(body["messages"], ROLES, content_optional=False)
        check_blocks(body["messages"])
        vision = any(has_image(m.get("content")) for m in body["messages"])
    else:
        vision, signed = scanned
    for i, tool in enumerate(req.tools or ()):
        if tool.input_schema is not None:
            check_schema(tool.input_schema, f"tools[{i}].input_schema")
    messages = body["messages"]
    # Anthropic's own rule ("all messages must have non-empty content except for the optional final
    # assistant message"): an empty one sent to an OpenAI backend failed in litellm's translation
    # (a ValueError, a 502 after every backend was tried).
    for i, m in enumerate(messages):
        if m.get("content") in ("", []) and not (i == len(messages) - 1 and m.get("role") == "assistant"):
            raise BadRequest(
                f"invalid request: messages.{i}.content: all messages must have non-empty content except for "
                "the optional final assistant message", param="messages",
            )  # fmt: skip
    thinking = req.thinking is not None and req.thinking.type != "disabled"
    user_id = (req.metadata or {}).get("user_id")
    return ClientRequest(
        protocol=ANTHROPIC,
        encoded=encoded,
        body=allow(body, ALLOWED),
        model=req.model,
        stream=bool(req.stream),
        messages=messages,
        system=body.get("system"),
        tools=body.get("tools") or [],
        max_output_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        thinking=thinking,
        thinking_budget=req.thinking.budget_tokens if req.thinking and thinking else None,
        reasoning_effort=_effort(body.get("output_config")),
        vision=vision,
        unseen=names_unseen(encoded.get("messages")),
        signed_blocks=signed,
        first_user_text=first_user_text(messages),
        system_text=text_of(body.get("system")),
        session_hint=session_from_user_id(user_id) if isinstance(user_id, str) else None,
    )


def check_blocks(messages: list[dict[str, Any]]) -> None:
    """Every content block is of a type the Messages API knows; a system message is not first.

    Only the block's type is checked, and that a text block has its text and an image its source
    (without, it failed at the backend in the provider's words, or in translation): fields a
    known block does not declare pass through as before (a provider's newer options)."""
    if messages[0].get("role") == "system":
        raise BadRequest(
            "invalid request: messages.0.role: a system message cannot open the conversation; "
            "put it in the top-level system field",
            param="messages",
        )
    check_parts(messages, BLOCK_TYPES, "messages", "content block")


def _effort(output_config: Any) -> str | None:
    """Claude Code's ``output_config.effort`` (low/medium/high): logged as the reasoning effort."""
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    return effort if isinstance(effort, str) else None


def session_from_user_id(user_id: str) -> str | None:
    """Claude Code's ``metadata.user_id`` ends in ``_session_<uuid>`` (or is JSON with session_id)."""
    if user_id.startswith("{"):
        try:
            obj = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        sid = obj.get("session_id") if isinstance(obj, dict) else None
        return sid if isinstance(sid, str) else None
    _, sep, session = user_id.rpartition("_session_")
    return session or None if sep else None


def usage_from(obj: dict[str, Any]) -> Usage:
    u = obj.get("usage") or {}
    read = u.get("cache_read_input_tokens")
    write = u.get("cache_creation_input_tokens")
    base = u.get("input_tokens")
    return Usage(
        input_tokens=None if base is None else base + (read or 0) + (write or 0),
        output_tokens=u.get("output_tokens"),
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=one_hour_writes(u.get("cache_creation")),
        provider_model=obj.get("model"),
        response_id=obj.get("id"),
        finish_reasons=[obj["stop_reason"]] if obj.get("stop_reason") else [],
        tool_calls=anthropic_calls(obj.get("content"), u),
    )


class StreamObserver:
    """Reads Anthropic stream events: input usage at message_start, output at message_delta."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.done = False
        self.error: str | None = None
        self.written: list[Any] = []
        #: The hosted calls begun (``server_tool_use`` blocks): charged if the usage never says.
        self._calls: set[tuple[str, str]] = set()

    def observe(self, event: str | None, data: bytes) -> bool:
        if event == "content_block_delta":
            said = event_json(data)
            self.written.append(said.get("delta") if isinstance(said, dict) else None)
            return True
        if event == "content_block_start":
            said = event_json(data)
            block = said.get("content_block") if isinstance(said, dict) else None
            if (kind := block_kind(block)) is not None:
                assert isinstance(block, dict)
                self._calls.add(block_call(kind, block, len(self._calls)))
                self.usage.tool_calls = most(self.usage.tool_calls, counted(self._calls))
            return False
        if event == "message_stop":
            self.done = True
            return False
        if event == "error":
            said = event_json(data)
            self.error = error_message(said.get("error") if isinstance(said, dict) else said)
            return False
        if event == "message_start":
            try:
                msg = event_json(data).get("message") or {}
            except AttributeError:
                return False
            self.usage = usage_from(msg)
            # Provisional until message_delta: message_start carries an output count of 1 or so,
            # and a translated stream (litellm) reports 0 input tokens here. A stream cut before
            # message_delta is then estimated rather than billed at these placeholders.
            self.usage.output_tokens = None
            if not self.usage.input_tokens:
                self.usage.input_tokens = None
        elif event == "message_delta":
            try:
                delta = event_json(data)
                u = delta.get("usage") or {}
                stop = (delta.get("delta") or {}).get("stop_reason")
            except AttributeError:
                return False
            if stop:
                self.usage.finish_reasons.append(stop)
            self.usage.tool_calls = most(self.usage.tool_calls, reported_calls(u))
            if u.get("output_tokens") is not None:
                self.usage.output_tokens = u["output_tokens"]
            # Some backends only know input counts at the end of the stream.
            if u.get("input_tokens"):
                read = u.get("cache_read_input_tokens") or self.usage.cache_read_tokens or 0
                write = u.get("cache_creation_input_tokens") or self.usage.cache_write_tokens or 0
                self.usage.input_tokens = u["input_tokens"] + read + write
                self.usage.cache_write_1h_tokens = (
                    one_hour_writes(u.get("cache_creation")) or self.usage.cache_write_1h_tokens
                )
        return False


def error_frame(err: RouterError) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(err.anthropic_body()) + b"\n\n"
