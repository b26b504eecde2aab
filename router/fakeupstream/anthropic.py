"""Anthropic Messages (``POST /v1/messages`` and ``/count_tokens``) in the fake upstream's wire format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from router.errors import BadRequest, RouterError
from router.fakeupstream.reply import (
    FakeReply,
    FakeUsage,
    Frame,
    Ids,
    Prompt,
    Tool,
    parts_text,
    sign_thinking,
    split_text,
    sse,
)
from router.protocols.hosted import declared, max_uses

_MARKER = b'"cache_control"'
_ONE_HOUR = b'"ttl":"1h"'
_SIGNATURE = b'"signature"'
_PING = sse("ping", {"type": "ping"})
_STOP = sse("message_stop", {"type": "message_stop"})


def last_tool_result(messages: list[dict[str, Any]]) -> str | None:
    """Text of the first ``tool_result`` in the last user message, or None if it has none."""
    for message in reversed(messages):
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    return parts_text(block.get("content"), "text")
        return None
    return None


def check_signatures(index: int, message: dict[str, Any]) -> None:
    """Reject thinking blocks whose signature was not made for their text, as the real API does."""
    content = message["content"]
    if not isinstance(content, list):
        return
    for j, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str) or block.get("signature") != sign_thinking(thinking):
                raise BadRequest(f"messages.{index}.content.{j}: Invalid `signature` in `thinking` block")


def chosen_tools(tools: list[Any], choice: Any) -> list[Tool]:
    """Client tools the reply may call (server tools have no input schema and are skipped)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "none":
        return []
    found: list[Tool] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{i}.name: Field required")
        schema = tool.get("input_schema")
        if isinstance(schema, dict):
            found.append(Tool(tool["name"], schema))
    if kind == "tool":
        found.sort(key=lambda t: t.name != choice.get("name"))
    return found


def usage_body(usage: FakeUsage) -> dict[str, Any]:
    # Anthropic's input_tokens excludes what was read from or written to the cache.
    fresh = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_creation_tokens)
    return {
        "input_tokens": fresh,
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_creation_tokens - usage.cache_creation_1h_tokens,
            "ephemeral_1h_input_tokens": usage.cache_creation_1h_tokens,
        },
        "output_tokens": usage.output_tokens,
        "service_tier": "standard",
    }


class AnthropicMessages:
    """Parses Messages requests and renders replies as messages or the streaming event sequence."""

    request_id_header = "request-id"
    broken_frame = b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": {\n\n'
    error_frame = sse(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    context_message = "prompt is too long: {tokens} tokens > {window} maximum"

    def __init__(self, *, require_max_tokens: bool = True) -> None:
        # count_tokens takes the same body as messages, minus max_tokens.
        self._require_max_tokens = require_max_tokens

    def prompt(self, body: dict[str, Any], model: str) -> Prompt:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: expected a non-empty list")
        if self._require_max_tokens:
            max_tokens = body.get("max_tokens")
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
                raise BadRequest("max_tokens: Field required (an integer)")
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise BadRequest("system: expected a string or a list of text blocks")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools: expected a list")
        items: list[bytes] = []
        for i, message in enumerate(messages):
            # "system" mid-conversation is what Claude Code sends with the mid-conversation-system beta.
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
                raise BadRequest(f"messages.{i}.role: expected 'user', 'assistant' or 'system'")
            if not isinstance(message.get("content"), str | list):
                raise BadRequest(f"messages.{i}.content: expected a string or a list of blocks")
            item = orjson.dumps(message)
            if _SIGNATURE in item and message["role"] == "assistant":
                check_signatures(i, message)
            items.append(item)
        head = (orjson.dumps(system) if system else b"") + (orjson.dumps(tools) if tools else b"")
        thinking = body.get("thinking")
        return Prompt(
            model=model,
            head=head,
            items=items,
            tools=chosen_tools(tools, body.get("tool_choice")) if tools else [],
            tool_result=last_tool_result(messages),
            thinking=isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"),
            cache_marker=(marker := cache_marker(head, items)),
            cache_1h=marker is not None and _ONE_HOUR in (items[marker - 1] if marker else head),
            hosted=declared(tools or ()),
            max_uses=max_uses(tools or ()),
        )

    def content(self, reply: FakeReply, ids: Ids) -> tuple[list[dict[str, Any]], str]:
        blocks: list[dict[str, Any]] = []
        if reply.thinking is not None:
            blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": reply.signature})
        for kind in reply.hosted:
            if kind in _SERVER_TOOLS:
                use = {
                    "type": "server_tool_use",
                    "id": ids.new("srvtoolu_"),
                    "name": kind,
                    "input": {"query": "fake"},
                }
                blocks += [use, {"type": f"{kind}_tool_result", "tool_use_id": use["id"], "content": []}]
        call = reply.tool_call
        if call is None:
            blocks.append({"type": "text", "text": reply.text})
            return blocks, "end_turn"
        tool_id = ids.new("toolu_")
        blocks.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": call.arguments})
        return blocks, "tool_use"

    def complete(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> dict[str, Any]:
        message_id = ids.new("msg_")
        blocks, stop = self.content(reply, ids)
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": reply.model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {**usage_body(reply.usage), **_server_tool_use(reply.hosted)},
        }

    def frames(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> list[Frame]:
        message = self.complete(reply, body, ids)
        frames: list[Frame] = []

        def emit(kind: str, content: bool = False, **fields: Any) -> None:
            frames.append((sse(kind, {"type": kind, **fields}), content))

        # The searches made are counted at the end (message_delta), as Anthropic does.
        usage = {**usage_body(reply.usage), "output_tokens": 1}
        emit("message_start", message={**message, "content": [], "stop_reason": None, "usage": usage})
        for index, block in enumerate(message["content"]):
            empty: dict[str, Any]
            deltas: list[dict[str, Any]]
            if block["type"] == "thinking":
                empty = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": p} for p in split_text(block["thinking"], 2)]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            elif block["type"] == "tool_use":
                empty = {**block, "input": {}}
                pieces = reply.tool_call.pieces if reply.tool_call else []
                deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
            elif block["type"] != "text":  # a hosted call and its result come whole
                empty, deltas = block, []
            else:
                empty = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in reply.pieces]
            emit("content_block_start", index=index, content_block=empty)
            if index == 0:
                frames.append((_PING, False))
            for delta in deltas:
                emit("content_block_delta", True, index=index, delta=delta)
            emit("content_block_stop", index=index)
        emit(
            "message_delta",
            delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
            usage={"output_tokens": reply.usage.output_tokens, **_server_tool_use(reply.hosted)},
        )
        frames.append((_STOP, False))
        return frames

    def error_body(self, error: RouterError) -> dict[str, Any]:
        return error.anthropic_body()


#: The server tools this server plays (what Anthropic runs itself and bills per call).
_SERVER_TOOLS = ("web_search", "web_fetch", "code_execution")


def _server_tool_use(hosted: Sequence[str]) -> dict[str, Any]:
    """The usage's count of the searches and fetches made, as Anthropic reports them."""
    counts = {f"{k}_requests": n for k in ("web_search", "web_fetch") if (n := hosted.count(k))}
    return {"server_tool_use": counts} if counts else {}


def cache_marker(head: bytes, items: list[bytes]) -> int | None:
    """Prefix length (in items) that ends at the last ``cache_control`` marker, if there is one."""
    for k in range(len(items), 0, -1):
        if _MARKER in items[k - 1]:
            return k
    return 0 if _MARKER in head else None


def count_tokens(prompt: Prompt) -> int:
    return max(1, (len(prompt.head) + sum(len(item) for item in prompt.items)) // 4)
