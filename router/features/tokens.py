"""Offline prompt-token estimates for the three wire protocols, cheap on a growing conversation.

The count uses the real o200k_base BPE (cl100k_base when o200k is not available), read from
the encoding files litellm ships (``router.features.bpe``), so nothing is downloaded. It is an *estimate* for routing and
context-window checks, not a bill:

* each message / input item costs its text plus 4 tokens, the reply priming 3 more;
* an image costs a flat ``IMAGE_TOKENS`` (providers charge 85-1,600 by size; 1,000 is a
  conservative middle that needs no image decoding);
* tool calls count their name and JSON arguments, tool definitions their JSON text;
* parts of unknown type (documents, audio, files...) count ``len(json) // 4``;
* encrypted reasoning (``encrypted_content``, ``redacted_thinking``) counts nothing.

Every message's count is cached under a hash of its JSON, so a conversation resent with one
more message costs only the new message. Malformed shapes never raise: whatever can be read
is counted, validation is someone else's job.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson
import tiktoken

from router.features.bpe import default_encoding
from router.protocols.common import ANTHROPIC, OPENAI_CHAT, ClientRequest

__all__ = [
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "TokenCounter",
    "item_text",
    "tools_text",
]

IMAGE_TOKENS = 1_000
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3

# tiktoken's regex engine gives up (a Rust panic) on runs of about a million characters, so
# long texts are encoded in pieces, cut at a newline when there is one.
_CHUNK_CHARS = 64_000
_MAX_DEPTH = 32
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "summary_text", "reasoning_text"})
_IMAGE_PARTS = frozenset({"image", "image_url", "input_image"})
# Domain separation for the cache key: the same JSON counts differently as a tool list.
_ITEM_KEY = b"router.item"
_TOOLS_KEY = b"router.tools"


def _dumps(value: Any) -> bytes | None:
    """JSON bytes of any JSON-loaded value, or None if it cannot be serialized at all."""
    try:
        return orjson.dumps(value)
    except TypeError:  # ints beyond 64 bits, nesting beyond orjson's limit, non-str keys
        pass
    try:
        return json.dumps(value, default=repr, ensure_ascii=False).encode()
    except (TypeError, ValueError, RecursionError):
        return None


def _json_estimate(value: Any) -> int:
    blob = _dumps(value)
    return len(blob) // 4 if blob is not None else 0


def _add_text(value: Any, texts: list[str]) -> None:
    """Add a field that should be text; anything else is counted as its JSON text."""
    if isinstance(value, str):
        texts.append(value)
    elif value is not None:
        blob = _dumps(value)
        if blob is not None:
            texts.append(blob.decode())


def _collect_item(item: Any, texts: list[str], depth: int) -> int:
    """Collect a message, input item, system or instructions value; returns its fixed tokens."""
    if not isinstance(item, dict):
        return _collect_content(item, texts, depth)
    kind = item.get("type")
    if kind is not None and kind != "message":
        return _collect_part(item, texts, depth)
    fixed = _collect_content(item.get("content"), texts, depth + 1)
    _add_text(item.get("name"), texts)
    _add_text(item.get("refusal"), texts)
    tool_calls = item.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            fixed += _collect_tool_call(call, texts)
    elif tool_calls is not None:
        fixed += _json_estimate(tool_calls)
    legacy_call = item.get("function_call")
    if legacy_call is not None:
        fixed += _collect_tool_call({"function": legacy_call}, texts)
    return fixed


def _collect_tool_call(call: Any, texts: list[str]) -> int:
    if isinstance(call, dict):
        function = call.get("function")
        if not isinstance(function, dict):
            function = call.get("custom")
        if isinstance(function, dict):
            _add_text(function.get("name"), texts)
            _add_text(function.get("arguments", function.get("input")), texts)
            return 0
    return _json_estimate(call)


def _collect_content(value: Any, texts: list[str], depth: int) -> int:
    if isinstance(value, str):
        texts.append(value)
        return 0
    if value is None:
        return 0
    if isinstance(value, list):
        if depth > _MAX_DEPTH:
            return _json_estimate(value)
        return sum(_collect_part(part, texts, depth + 1) for part in value)
    return _collect_part(value, texts, depth)


def _collect_part(part: Any, texts: list[str], depth: int) -> int:
    if not isinstance(part, dict):
        if part is None or isinstance(part, str | list):
            return _collect_content(part, texts, depth + 1)
        return _json_estimate(part)
    if depth > _MAX_DEPTH:
        return _json_estimate(part)
    kind = part.get("type")
    if not isinstance(kind, str):
        return _json_estimate(part)
    if kind in _TEXT_PARTS:
        _add_text(part.get("text"), texts)
    elif kind in _IMAGE_PARTS:
        return IMAGE_TOKENS
    elif kind == "refusal":
        _add_text(part.get("refusal"), texts)
    elif kind == "thinking":
        _add_text(part.get("thinking"), texts)
    elif kind == "redacted_thinking":
        return 0
    elif kind in ("tool_use", "function_call", "custom_tool_call"):
        _add_text(part.get("name"), texts)
        arguments = part.get("input") if kind != "function_call" else part.get("arguments")
        _add_text(arguments, texts)
    elif kind == "tool_result":
        return _collect_content(part.get("content"), texts, depth + 1)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        return _collect_content(part.get("output"), texts, depth + 1)
    elif kind == "reasoning":
        # encrypted_content is opaque to us and is deliberately not counted.
        return _collect_content(part.get("summary"), texts, depth + 1) + _collect_content(
            part.get("content"), texts, depth + 1
        )
    elif kind == "message":
        return _collect_item(part, texts, depth + 1)
    else:
        return _json_estimate(part)
    return 0


def item_text(item: Any) -> tuple[int, str]:
    """What ``count_item`` counts: the fixed tokens (overhead, images...) and the text it tokenizes."""
    texts: list[str] = []
    fixed = MESSAGE_OVERHEAD + _collect_item(item, texts, 0)
    return fixed, texts[0] if len(texts) == 1 else "\n".join(texts)


def tools_text(tools: Any) -> str:
    """The text ``count_tools`` tokenizes."""
    blob = _dumps(tools) if tools else None
    return blob.decode() if blob is not None else ""


_QUICK = "router.features.tokens.quick/1"


class TokenCounter:
    """Token estimates with an LRU cache of per-message counts (thread-safe).

    ``hits`` and ``misses`` count cache look-ups (messages, system/instructions, tool lists).
    ``max_entries=0`` disables the cache.
    """

    def __init__(self, max_entries: int = 100_000, *, encoding: tiktoken.Encoding | None = None) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self._max_entries = max_entries
        self._encoding = encoding
        self._cache: OrderedDict[bytes | int, int] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def encoding(self) -> tiktoken.Encoding:
        if self._encoding is None:
            self._encoding = default_encoding()
        return self._encoding

    @property
    def loaded(self) -> bool:
        """Whether the encoding is loaded (the router loads it in the background at start)."""
        return self._encoding is not None

    @property
    def encoding_name(self) -> str:
        return self.encoding.name

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (special-token strings count as ordinary text). Not cached."""
        encode = self.encoding.encode_ordinary
        if len(text) <= _CHUNK_CHARS:
            return _safe_len(encode, text)
        total, start, end_of_text = 0, 0, len(text)
        while start < end_of_text:
            end = min(start + _CHUNK_CHARS, end_of_text)
            if end < end_of_text:
                newline = text.rfind("\n", start + _CHUNK_CHARS // 2, end)
                if newline >= 0:
                    end = newline + 1
            total += _safe_len(encode, text[start:end])
            start = end
        return total

    def count_request(self, req: ClientRequest) -> int:
        """A parsed request's whole prompt, in its protocol's shape."""
        if req.protocol == OPENAI_CHAT:
            return self.count_openai_chat(req.messages, req.tools or None)
        if req.protocol == ANTHROPIC:
            return self.count_anthropic(req.system, req.messages, req.tools or None)
        return self.count_responses(req.system, req.messages, req.tools or None)

    def count_openai_chat(self, messages: Any, tools: Any = None) -> int:
        """Chat Completions ``messages`` (+ ``tools``)."""
        return REPLY_PRIMING + self._items(messages) + self._tools(tools)

    def count_anthropic(self, system: Any, messages: Any, tools: Any = None) -> int:
        """Anthropic Messages ``system`` (string or text blocks), ``messages`` (+ ``tools``)."""
        total = REPLY_PRIMING + self._items(messages) + self._tools(tools)
        if system:
            total += self._item(system)
        return total

    def count_responses(self, instructions: Any, input: Any, tools: Any = None) -> int:
        """Responses API ``instructions`` and ``input`` (a string or a list of items) (+ ``tools``)."""
        total = REPLY_PRIMING + self._tools(tools)
        if instructions:
            total += self._item(instructions)
        return total + self._items(input)

    def count_item(self, item: Any) -> int:
        """One message, input item, system or instructions value (cached)."""
        return self._item(item)

    def count_tools(self, tools: Any) -> int:
        """A tool list (cached)."""
        return self._tools(tools)

    def peek_item(self, item: Any) -> int | None:
        """``count_item`` if it is cached, else None: never tokenizes."""
        key = _quick_key(item) if self._max_entries else None
        return self._peek(key if key is not None else _blob_key(_ITEM_KEY, item))

    def peek_tools(self, tools: Any) -> int | None:
        """``count_tools`` if it is cached (0 for no tools), else None: never tokenizes."""
        return self._peek(_blob_key(_TOOLS_KEY, tools)) if tools else 0

    def _peek(self, key: bytes | int | None) -> int | None:
        if key is None or self._max_entries == 0:
            return None
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            return cached

    def _items(self, items: Any) -> int:
        if isinstance(items, list | tuple):
            return sum(self._item(item) for item in items)
        if items is None:
            return 0
        return self._item(items)

    def _item(self, item: Any) -> int:
        key = _quick_key(item) if self._max_entries else None
        if key is None:
            return self._cached(_ITEM_KEY, item, self._count_item)
        return self._lookup(key, lambda: self._count_item(item, None))

    def _tools(self, tools: Any) -> int:
        if not tools:
            return 0
        return self._cached(_TOOLS_KEY, tools, self._count_tools)

    def _count_item(self, item: Any, blob: bytes | None) -> int:
        fixed, text = item_text(item)
        return fixed + (self.count_text(text) if text else 0)

    def _count_tools(self, tools: Any, blob: bytes | None) -> int:
        return self.count_text(blob.decode()) if blob is not None else 0

    def _cached(self, person: bytes, value: Any, compute: Callable[[Any, bytes | None], int]) -> int:
        blob = _dumps(value)
        if blob is None or self._max_entries == 0:
            with self._lock:
                self.misses += 1
            return compute(value, blob)
        return self._lookup(_digest(person, blob), lambda: compute(value, blob))

    def _lookup(self, key: bytes | int, compute: Callable[[], int]) -> int:
        cached = self._peek(key)
        if cached is not None:
            return cached
        with self._lock:
            self.misses += 1
        # Counting runs outside the lock: it is the slow part, and a racing duplicate is harmless.
        count = compute()
        with self._lock:
            self._cache[key] = count
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return count


def _digest(person: bytes, blob: bytes) -> bytes:
    # person= separates items from tool lists without concatenating bytes.
    return hashlib.blake2b(blob, digest_size=16, person=person[:16]).digest()


def _blob_key(person: bytes, value: Any) -> bytes | None:
    blob = _dumps(value)
    return _digest(person, blob) if blob is not None else None


_SAMPLE = 256


def _quick_key(item: Any) -> int | None:
    """A constant-time cache key for a plain message (string fields only), or None.

    A long conversation resends every earlier message on every turn; serialising and hashing
    them all each time costs more than the rest of the decision. For plain messages the key is
    built from each field's length, head and tail instead. Two messages that agree on all of
    those but differ in the middle share a count: an estimate off by the difference of two
    equally long texts, which routing tolerates. Structured content keeps the exact key.
    """
    if type(item) is not dict or len(item) > 4:
        return None
    parts: list[Any] = [_QUICK]
    for k, v in item.items():
        if type(v) is not str:
            return None
        parts.append(k)
        parts.append(v if len(v) <= 2 * _SAMPLE else (len(v), v[:_SAMPLE], v[-_SAMPLE:]))
    return hash(tuple(parts))


def _safe_len(encode: Callable[[str], list[int]], text: str) -> int:
    try:
        return len(encode(text))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # pyo3's PanicException derives from BaseException
        return len(text) // 4
