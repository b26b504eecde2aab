"""Hosted tools: the ones the provider runs itself and bills per call, on top of tokens.

A Responses request may declare ``web_search``, ``file_search``, ``code_interpreter`` or
``image_generation`` tools, an Anthropic one ``web_search_20250305``, ``web_fetch_*`` or
``code_execution_*``: the provider calls them while it answers and bills each call (a search, a
container, an image) whatever the tokens. They are named here by their *kind*, the tool type
without its date (``web_search_20250305`` and ``web_search_2025_08_26`` are ``web_search``);
``router.policy.catalog`` prices each kind. What a reply shows of them is counted per kind: the
Responses output items (``web_search_call``, ...), Anthropic's ``server_tool_use`` blocks and
``usage.server_tool_use`` counts, whichever says more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_DATED = re.compile(r"_(\d{8}|\d{4}_\d{2}_\d{2})$")

#: Tool types the client runs itself (function tools and the local ones): never billed per call.
_CLIENT = frozenset({
    "function", "custom", "local_shell", "shell", "apply_patch", "computer_use_preview", "computer",
    "bash", "text_editor", "memory", "mcp",
})  # fmt: skip

#: The Responses output item each hosted call leaves (a web search's kind is the declared tool's).
_ITEMS = {
    "file_search_call": "file_search",
    "code_interpreter_call": "code_interpreter",
    "image_generation_call": "image_generation",
}
#: Anthropic's server tool names (a ``server_tool_use`` block's ``name``) by kind.
_SERVER_NAMES = {
    "web_search": "web_search",
    "web_fetch": "web_fetch",
    "code_execution": "code_execution",
    "bash_code_execution": "code_execution",
    "text_editor_code_execution": "code_execution",
}
#: Kinds billed per container, not per call: a reply's calls in one container are one.
PER_CONTAINER = frozenset({"code_interpreter", "code_execution"})


def kind_of(tool_type: str) -> str:
    return _DATED.sub("", tool_type)


def declared(tools: Iterable[Any]) -> tuple[str, ...]:
    """The kinds of the hosted tools a request declares, each once, in order."""
    kinds: dict[str, None] = {}
    for tool in tools:
        kind = tool.get("type") if type(tool) is dict or isinstance(tool, Mapping) else None
        # A function tool is the common case: no date to strip (a body of 100,000 tools spent a
        # second of the event loop in the regular expression).
        if isinstance(kind, str) and kind not in _CLIENT and (kind := kind_of(kind)) not in _CLIENT:
            kinds[kind] = None
    return tuple(kinds)


def max_uses(tools: Iterable[Any], total: int | None = None) -> dict[str, int]:
    """The most calls of each hosted kind the provider makes for one reply, where the request
    caps every tool of that kind (Anthropic's server tools' ``max_uses``; a kind declared twice
    is capped at the sum), or caps them all together (``total``: the Responses API's
    ``max_tool_calls``, which then caps each kind too). A kind nothing caps is not named."""
    if total is not None:
        own = max_uses(tools)
        return {kind: min(own.get(kind, total), total) for kind in declared(tools)}
    caps: dict[str, int] = {}
    uncapped: set[str] = set()
    for tool in tools:
        kind = tool.get("type") if type(tool) is dict or isinstance(tool, Mapping) else None
        if not isinstance(kind, str) or kind in _CLIENT or (kind := kind_of(kind)) in _CLIENT:
            continue
        n = tool.get("max_uses")
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            caps[kind] = caps.get(kind, 0) + n
        else:
            uncapped.add(kind)
    return {kind: n for kind, n in caps.items() if kind not in uncapped}


def _search_kind(tools: Any) -> str:
    """A ``web_search_call``'s kind: the preview tool when the request declared only that one
    (OpenAI prices it apart), else ``web_search``."""
    kinds = declared(tools) if isinstance(tools, list) else ()
    return (
        "web_search_preview" if "web_search_preview" in kinds and "web_search" not in kinds else "web_search"
    )


def item_kind(item: Any, tools: Any) -> tuple[str, str] | None:
    """The kind of the hosted call a Responses output item is, and what makes it one call (its
    container for a per-container kind, else its id); None for any other item."""
    if not isinstance(item, Mapping):
        return None
    kind = _search_kind(tools) if item.get("type") == "web_search_call" else _ITEMS.get(str(item.get("type")))
    if kind is None:
        return None
    one = item.get("container_id") if kind in PER_CONTAINER else None
    return kind, str(one or item.get("id") or id(item))


def responses_calls(output: Any, tools: Any) -> dict[str, int]:
    """Hosted calls per kind in a Responses reply's ``output``; ``tools``: the request's."""
    seen: set[tuple[str, str]] = set()
    for item in output if isinstance(output, list) else ():
        if (call := item_kind(item, tools)) is not None:
            seen.add(call)
    return counted(seen)


def block_kind(block: Any) -> str | None:
    """The kind of the hosted call an Anthropic content block is (a ``server_tool_use``)."""
    if not isinstance(block, Mapping) or block.get("type") != "server_tool_use":
        return None
    name = block.get("name")
    return _SERVER_NAMES.get(name, name) if isinstance(name, str) else None


def block_call(kind: str, block: Mapping[str, Any], i: int) -> tuple[str, str]:
    """What makes a server tool block one call: its id (a container's calls are one)."""
    return kind, "" if kind in PER_CONTAINER else str(block.get("id") or i)


def anthropic_calls(content: Any, usage: Any) -> dict[str, int]:
    """Hosted calls per kind in an Anthropic reply: its ``server_tool_use`` blocks, or the counts
    its usage reports (``server_tool_use.web_search_requests``), whichever is more."""
    seen: set[tuple[str, str]] = set()
    for i, block in enumerate(content if isinstance(content, list) else ()):
        if (kind := block_kind(block)) is not None:
            seen.add(block_call(kind, block, i))
    return most(counted(seen), reported_calls(usage))


def reported_calls(usage: Any) -> dict[str, int]:
    """``usage.server_tool_use``'s counts by kind (``web_search_requests`` is ``web_search``)."""
    server = usage.get("server_tool_use") if isinstance(usage, Mapping) else None
    if not isinstance(server, Mapping):
        return {}
    return {
        key.removesuffix("_requests"): n
        for key, n in server.items()
        if isinstance(n, int) and not isinstance(n, bool) and n > 0
    }


def most(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in {*a, *b}}


def counted(calls: Iterable[tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind, _ in calls:
        counts[kind] = counts.get(kind, 0) + 1
    return counts
