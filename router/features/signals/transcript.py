"""Tool calls and tool results out of a conversation, whatever the protocol's shape.

The shapes of the three protocols do not overlap, so one reader handles them all:
OpenAI chat (assistant ``tool_calls``, ``role: "tool"`` messages), Anthropic (``tool_use`` and
``tool_result`` content blocks) and OpenAI Responses (``function_call`` / ``*_output`` items).
Agents without tool calling (mini-swe-agent v1's text protocol) put one fenced ``bash`` block in
an assistant message and get the result back as a user message that starts ``<returncode>``
(or says the command timed out): those read as a ``bash`` call and its result.
Anything that does not fit is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final

import orjson

from router.features.signals.fingerprint import stable_hash

CALL_ITEMS: Final = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUT_ITEMS: Final = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}
)
#: Arguments longer than this are hashed as text rather than parsed (a file write, say).
_MAX_PARSED_ARGS: Final = 256_000
#: mini-swe-agent's action block (its ``action_regex``); a message with several is a format error.
_BASH_BLOCK: Final = re.compile(r"```bash\s*\n(.*?)\n```", re.S)
#: The openings of a text-protocol observation: mini-swe-agent's result, and its timeout notice.
_RESULT_START: Final = "<returncode>"
_TIMEOUT_START: Final = "The last command <command>"
TEXT_TOOL: Final = "bash"


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str | None
    name: str
    #: A hash of the arguments, insensitive to JSON key order and spacing.
    args_hash: str

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.args_hash


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str | None
    text: str
    is_error: bool | None


Event = ToolCall | ToolResult


def _args_hash(args: Any) -> str:
    if isinstance(args, str):
        return _text_args_hash(args)
    return _value_hash(args)


# Every turn re-reads the calls of the last messages, and a conversation's earlier calls come
# back as the same strings: each is parsed and hashed once (bounded), then remembered.
@functools.lru_cache(maxsize=8192)
def _text_args_hash(args: str) -> str:
    if len(args) <= _MAX_PARSED_ARGS and args[:1] in ("{", "["):
        try:
            return _value_hash(orjson.loads(args))
        except orjson.JSONDecodeError:
            pass
    return _value_hash(args)


def forget_calls() -> None:
    _text_args_hash.cache_clear()


def _value_hash(value: Any) -> str:
    """Key-order-insensitive: JSON with sorted keys, written in C; the Python walk for what orjson refuses."""
    try:
        blob = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: non-str keys, ints beyond 64 bits, deep nesting
        return stable_hash(value)
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _text(content: Any) -> str:
    """The text of a tool result: a string, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _call(call_id: Any, name: Any, args: Any) -> ToolCall:
    return ToolCall(_str_or_none(call_id), name if isinstance(name, str) else "", _args_hash(args))


def _chat_calls(msg: dict[str, Any]) -> list[Event]:
    out: list[Event] = []
    calls = msg.get("tool_calls")
    for c in calls if isinstance(calls, list) else ():
        if isinstance(c, dict):
            fn = c.get("function")
            fn = fn if isinstance(fn, dict) else {}
            out.append(_call(c.get("id"), fn.get("name"), fn.get("arguments")))
    legacy = msg.get("function_call")
    if isinstance(legacy, dict):
        out.append(_call(None, legacy.get("name"), legacy.get("arguments")))
    return out


def _blocks(content: Any) -> list[Event]:
    out: list[Event] = []
    for b in content if isinstance(content, list) else ():
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "tool_use":
            out.append(_call(b.get("id"), b.get("name"), b.get("input")))
        elif kind == "tool_result":
            is_error = b.get("is_error")
            out.append(
                ToolResult(
                    _str_or_none(b.get("tool_use_id")),
                    _text(b.get("content")),
                    is_error if isinstance(is_error, bool) else None,
                )
            )
    return out


def text_command(content: Any) -> str | None:
    """The command of a text-protocol assistant turn: its one ``bash`` block (None: none, or several)."""
    text = _text(content)
    if "```bash" not in text:
        return None
    blocks = _BASH_BLOCK.findall(text)
    return blocks[0] if len(blocks) == 1 else None


def text_result(content: Any) -> ToolResult | None:
    """A text-protocol observation sent as a user message, if this is one."""
    text = _text(content)
    head = text[:64].lstrip()
    if head.startswith(_RESULT_START):
        return ToolResult(None, text, None)
    if head.startswith(_TIMEOUT_START) and "timed out" in text[:4096]:
        return ToolResult(None, text, True)
    return None


def _text_protocol(role: Any, item: dict[str, Any], events: list[Event]) -> list[Event]:
    """What a message says in the text protocol, when it carries no tool-calling structure."""
    if events:
        return events
    if role == "assistant":
        command = text_command(item.get("content"))
        return [_call(None, TEXT_TOOL, command)] if command is not None else []
    if role == "user":
        result = text_result(item.get("content"))
        return [result] if result is not None else []
    return []


def _item(item: dict[str, Any]) -> list[Event]:
    kind = item.get("type") if isinstance(item.get("type"), str) else None
    if kind in CALL_ITEMS:
        if kind == "local_shell_call":
            return [_call(item.get("call_id"), "local_shell", item.get("action"))]
        args = item.get("arguments") if kind == "function_call" else item.get("input")
        return [_call(item.get("call_id"), item.get("name"), args)]
    if kind in _OUTPUT_ITEMS:
        return [ToolResult(_str_or_none(item.get("call_id")), _text(item.get("output")), None)]
    role = item.get("role")
    if role in ("tool", "function"):
        return [ToolResult(_str_or_none(item.get("tool_call_id")), _text(item.get("content")), None)]
    out = _chat_calls(item) if role == "assistant" else []
    return _text_protocol(role, item, out + _blocks(item.get("content")))


def message_events(item: Any) -> list[Event]:
    """Tool calls and results of one message (or input item)."""
    return _item(item) if isinstance(item, dict) else []
