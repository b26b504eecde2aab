"""The provider-independent part of an answer: what to say, whether to call a tool, and usage.

Each protocol module boils its request down to a ``Prompt``; ``Planner.plan`` turns a prompt and a
behaviour into a ``FakeReply`` that the protocol module then renders in its own wire format.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.fakeupstream.behaviour import Behaviour

THINKING_TEXT = "The user wants a short answer. I will reply briefly and stay on topic."
#: Reasoning tokens reported per effort level; unknown levels count as medium.
REASONING_TOKENS = {"none": 0, "minimal": 8, "low": 32, "medium": 128, "high": 512, "xhigh": 1024}
_FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
_PREFIXES_PER_MODEL = 8192
_SPLIT_CACHE = 512


def parts_text(value: Any, part_type: str) -> str:
    """The text of a string, or of the parts of type ``part_type`` in a list of parts (every
    protocol's message content and tool result take either; anything else has none)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            part.get("text", "") for part in value if isinstance(part, dict) and part.get("type") == part_type
        )
    return ""


def fetched_parts(item: bytes) -> int:
    """Parts of a serialized message the provider would read from elsewhere: a source by URL, a
    file by its id or URL."""
    return item.count(b'"type":"url"') + item.count(b'"file_id"') + item.count(b'"file_url"')


def sign_thinking(thinking: str) -> str:
    """A stable fake signature: the same thinking text always gets the same signature."""
    digest = hashlib.sha256(b"fake-upstream-thinking:" + thinking.encode()).digest()
    return base64.b64encode(b"FAKESIG" + digest * 2).decode()


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request reduced to what the planner needs."""

    model: str
    #: Serialized system prompt and tools: the start of every cacheable prefix.
    head: bytes
    #: Each conversation item (message) serialized, in order.
    items: Sequence[bytes]
    #: Tools the reply may call, preferred first (``tool_choice`` already applied).
    tools: Sequence[Tool]
    #: Text of the tool result the conversation ends with, or None if it does not end with one.
    tool_result: str | None
    reasoning_effort: str | None = None
    thinking: bool = False
    #: Prefix length (in items) up to the last ``cache_control`` marker; None if there is none.
    cache_marker: int | None = None
    #: The kinds of the hosted tools the request declares (``router.protocols.hosted``).
    hosted: tuple[str, ...] = ()
    #: The most calls of a hosted kind the request allows (Anthropic's ``max_uses``), by kind.
    max_uses: Mapping[str, int] = field(default_factory=dict)
    #: The last marker asks for an hour (Anthropic's ``ttl: "1h"``) rather than five minutes.
    cache_1h: bool = False


@dataclass(frozen=True, slots=True)
class FakeUsage:
    input_tokens: int
    cached_tokens: int
    #: Tokens written to the (Anthropic) cache; 0 unless the request carries a cache marker.
    cache_creation_tokens: int
    output_tokens: int
    reasoning_tokens: int
    #: Of ``cache_creation_tokens``, those written for an hour.
    cache_creation_1h_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]
    arguments_json: str
    #: The argument JSON cut into the stream's deltas.
    pieces: Sequence[str]


@dataclass(frozen=True, slots=True)
class FakeReply:
    model: str
    text: str
    #: The text cut into the stream's deltas (empty when the reply is a tool call).
    pieces: Sequence[str]
    tool_call: ToolCall | None
    thinking: str | None
    signature: str | None
    usage: FakeUsage
    #: The hosted tool calls the reply makes before it answers, by kind, one entry a call.
    hosted: Sequence[str] = ()


def example_value(schema: Any, text: str = "ls") -> Any:
    """A value that satisfies a JSON schema well enough for a fake tool call; strings are ``text``."""
    if not isinstance(schema, Mapping):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "string":
        return text
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        # Codex's shell tool takes its command as a list of strings: ["ls"] runs, null would not.
        item = example_value(schema.get("items"), text)
        return [] if item is None else [item]
    if kind == "object":
        return example_arguments(schema, text)
    return None


def example_arguments(schema: Mapping[str, Any], text: str = "ls") -> dict[str, Any]:
    """Arguments with a value for each required property of an object schema."""
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    if not isinstance(required, list):
        return {}
    return {name: example_value(props.get(name), text) for name in required if isinstance(name, str)}


def split_text(text: str, chunks: int) -> list[str]:
    """Cut ``text`` into at most ``chunks`` non-empty pieces of about equal length."""
    n = len(text)
    if n == 0:
        return []
    chunks = min(chunks, n)
    return [text[i * n // chunks : (i + 1) * n // chunks] for i in range(chunks)]


# The same object every time, so later lookups keyed by the text do not rehash kilobytes.
@functools.lru_cache(maxsize=16)
def filler(size: int) -> str:
    """About ``size`` bytes of words, for ``big_kb`` replies."""
    return (_FILLER * (size // len(_FILLER) + 1))[:size]


def count_words(text: str) -> int:
    return max(1, len(text.split()))


class PrefixCache:
    """Remembers which prompt prefixes each model has seen, to simulate provider prompt caching."""

    def __init__(self, per_model: int = _PREFIXES_PER_MODEL) -> None:
        self._per_model = per_model
        self._seen: dict[str, OrderedDict[int, None]] = {}

    def longest_seen(self, model: str, prompt: Prompt) -> int | None:
        """Length (in items) of the longest prefix, short of the whole prompt, seen before; remember
        every prefix of this prompt for the requests that follow."""
        seen = self._seen.get(model)
        if seen is None:
            seen = self._seen[model] = OrderedDict()
        h = hash(prompt.head)
        hashes = [h]
        for item in prompt.items:
            h = hash((h, item))
            hashes.append(h)
        found: int | None = None
        # Prefix 0 (system and tools alone) counts only when there is such a head to cache.
        lowest = 0 if prompt.head else 1
        for k in range(len(prompt.items) - 1, lowest - 1, -1):
            if hashes[k] in seen:
                found = k
                break
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self._per_model:
            seen.popitem(last=False)
        return found


class Planner:
    """Decides replies. Holds only caches, so it is cheap to share across requests."""

    def __init__(self) -> None:
        self.prefixes = PrefixCache()
        self._splits: OrderedDict[tuple[str, int], tuple[list[str], int]] = OrderedDict()
        self._signature = sign_thinking(THINKING_TEXT)

    def _split(self, text: str, chunks: int) -> tuple[list[str], int]:
        key = (text, chunks)
        hit = self._splits.get(key)
        if hit is None:
            hit = self._splits[key] = (split_text(text, chunks), count_words(text))
            if len(self._splits) > _SPLIT_CACHE:
                self._splits.popitem(last=False)
        return hit

    def _text(self, prompt: Prompt, behaviour: Behaviour) -> str:
        if behaviour.text is not None:
            return behaviour.text
        if behaviour.big_kb:
            return filler(behaviour.big_kb * 1024)
        if prompt.tool_result is not None:
            return f"Tool result received: {prompt.tool_result[:40]}"
        return f"Hello from {prompt.model}. This is a fake reply."

    def _tool_call(self, prompt: Prompt, behaviour: Behaviour) -> ToolCall | None:
        if not prompt.tools or behaviour.tool == "never":
            return None
        if behaviour.tool == "auto" and prompt.tool_result is not None:
            return None
        tool = prompt.tools[0]
        text = "ls" if behaviour.tool_arg is None else behaviour.tool_arg
        arguments = example_arguments(tool.schema, text)
        arguments_json = orjson.dumps(arguments).decode()
        return ToolCall(tool.name, arguments, arguments_json, split_text(arguments_json, behaviour.chunks))

    def _usage(self, prompt: Prompt, behaviour: Behaviour, output_tokens: int) -> FakeUsage:
        lengths = [len(prompt.head)]
        for item in prompt.items:
            lengths.append(lengths[-1] + len(item))
        total = lengths[-1] // 4
        if behaviour.fetched_tokens:
            total += behaviour.fetched_tokens * sum(fetched_parts(item) for item in prompt.items)
        seen = self.prefixes.longest_seen(prompt.model, prompt)
        if behaviour.cached is not None:
            cached = min(behaviour.cached, total)
        else:
            cached = 0 if seen is None else lengths[seen] // 4
        creation = 0
        if prompt.cache_marker is not None:
            creation = max(0, lengths[prompt.cache_marker] // 4 - cached)
        reasoning = 0
        if prompt.reasoning_effort is not None:
            reasoning = REASONING_TOKENS.get(prompt.reasoning_effort, REASONING_TOKENS["medium"])
        return FakeUsage(
            total, cached, creation, output_tokens + reasoning, reasoning, creation if prompt.cache_1h else 0
        )

    def plan(self, prompt: Prompt, behaviour: Behaviour) -> FakeReply:
        thinking = THINKING_TEXT if prompt.thinking else None
        extra = count_words(THINKING_TEXT) if thinking else 0
        call = self._tool_call(prompt, behaviour)
        pieces: Sequence[str] = ()
        if call is not None:
            text, words = "", count_words(call.arguments_json)
        else:
            text = self._text(prompt, behaviour)
            pieces, words = self._split(text, behaviour.chunks)
        return FakeReply(
            model=prompt.model,
            text=text,
            pieces=pieces,
            tool_call=call,
            thinking=thinking,
            signature=self._signature if thinking else None,
            usage=self._usage(prompt, behaviour, words + extra),
            # As a provider does, no more calls of a kind than the request allows.
            hosted=[
                kind
                for kind in prompt.hosted
                for _ in range(min(behaviour.hosted_calls, prompt.max_uses.get(kind, behaviour.hosted_calls)))
            ],
        )


class Ids:
    """Deterministic response ids: a counter per server, formatted like each provider's ids."""

    def __init__(self) -> None:
        self._next = itertools.count(1).__next__

    def new(self, prefix: str) -> str:
        return f"{prefix}{self._next():024d}"


#: One server-sent event, and whether it carries content (counted by ``break_after`` and friends).
Frame = tuple[bytes, bool]


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    """A named server-sent event, as Anthropic and the Responses API send them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
