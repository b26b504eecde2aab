"""Tool definitions: a structural check that parameter schemas are JSON Schema, and tools that are refused.

Providers reject a malformed schema with their own 400, and litellm may fail on one in ways that
surface as a 5xx; checking the structure here gives the client one clear 400 naming the field.
The check is deliberately shallow: the keywords that hold sub-schemas must hold schemas, ``type``
must name JSON Schema types, ``required`` must list names. Everything else (formats, patterns,
unknown keywords) is the provider's business. It walks iteratively, so no schema can exhaust
the stack, and stops at ``MAX_DEPTH`` levels.
"""

from __future__ import annotations

import functools
from typing import Any

import orjson

from router.errors import BadRequest

MAX_DEPTH = 64
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
#: Keywords whose value maps names to sub-schemas.
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
#: Keywords whose value is a list of sub-schemas.
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
#: Keywords whose value is one sub-schema (``items`` may also be a list, as in draft 4).
_SINGLE = (
    "items", "not", "additionalProperties", "additionalItems", "contains", "if", "then", "else",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems",
)  # fmt: skip
_NAME_CHARS = 64


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _part(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[:_NAME_CHARS] + "…"


def check_schema(schema: Any, where: str) -> None:
    """Raise ``BadRequest`` naming the first place where ``schema`` is not a JSON Schema."""
    if not isinstance(schema, dict):
        raise BadRequest(f"{where}: a tool's parameters must be a JSON Schema object, got {_kind(schema)}")
    # Agents send the same tool definitions on every turn: serialising one is several times
    # cheaper than walking it, so each distinct schema is walked once and then remembered.
    try:
        blob = orjson.dumps(schema)
    except orjson.JSONEncodeError:
        blob = None
    if blob is not None and _accepted(blob):
        return
    _walk(schema, where)


@functools.lru_cache(maxsize=1024)
def _accepted(blob: bytes) -> bool:
    try:
        _walk(orjson.loads(blob), "")
    except BadRequest:
        return False
    return True


def _walk(schema: dict[str, Any], where: str) -> None:
    stack: list[tuple[Any, str, int]] = [(schema, where, 1)]
    while stack:
        node, path, depth = stack.pop()
        if node is None or isinstance(node, bool):  # true/false are schemas; null is treated as absent
            continue
        if not isinstance(node, dict):
            raise BadRequest(f"{path}: expected a schema (an object), got {_kind(node)}")
        if depth > MAX_DEPTH:
            raise BadRequest(f"{where}: tool schema nested deeper than {MAX_DEPTH} levels")
        kind = node.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds):
                raise BadRequest(
                    f"{path}.type: expected one of {', '.join(sorted(TYPES))} (or a list of them)"
                )
        required = node.get("required")
        # A boolean is draft 3's per-property form; anything else must list property names.
        if not (required is None or isinstance(required, bool) or _names(required)):
            raise BadRequest(f"{path}.required: expected an array of property names")
        if "enum" in node and not isinstance(node["enum"], list):
            raise BadRequest(f"{path}.enum: expected an array")
        for key in _MAPS:
            value = node.get(key)
            if value is None:
                continue
            if not isinstance(value, dict):
                raise BadRequest(
                    f"{path}.{key}: expected an object mapping names to schemas, got {_kind(value)}"
                )
            stack.extend((sub, f"{path}.{key}.{_part(str(name))}", depth + 1) for name, sub in value.items())
        for key in _LISTS:
            value = node.get(key)
            if value is None:
                continue
            if not isinstance(value, list):
                raise BadRequest(f"{path}.{key}: expected an array of schemas, got {_kind(value)}")
            stack.extend((sub, f"{path}.{key}[{i}]", depth + 1) for i, sub in enumerate(value))
        for key in _SINGLE:
            value = node.get(key)
            if key == "items" and isinstance(value, list):
                stack.extend((sub, f"{path}.items[{i}]", depth + 1) for i, sub in enumerate(value))
            elif value is not None:
                stack.append((value, f"{path}.{key}", depth + 1))


def check_responses_tools(tools: list[dict[str, Any]] | None) -> None:
    """Responses tools: function tools need a name and a schema; MCP tools are refused."""
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if not isinstance(kind, str) or not kind:
            # Forwarded, a type of a number or a list failed in translation (a TypeError, a 502
            # after every backend was tried); a relayed one, at the provider.
            raise BadRequest(f"tools[{i}].type: must be a string naming the tool's type", param="tools")
        if kind == "mcp":
            # The provider would connect to a server the client names, with whatever headers the
            # client adds: the same reason ``mcp_servers`` is never forwarded for Anthropic.
            raise BadRequest(
                f"tools[{i}]: remote MCP tools are not accepted by this router (the provider would "
                "connect to a server the client names); expose them to the model as function tools",
                param="tools",
            )
        if kind == "function":
            name = tool.get("name")
            if not isinstance(name, str) or not 1 <= len(name) <= 256:
                raise BadRequest(f"tools[{i}].name: a function tool needs a name (1-256 characters)")
            if tool.get("parameters") is not None:
                check_schema(tool["parameters"], f"tools[{i}].parameters")
