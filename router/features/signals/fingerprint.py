"""Stable hashes of JSON-like values: tool-call identity and the identical-request check.

The walk is iterative, so a deeply nested or self-referencing body cannot exhaust the stack,
and any value hashes without raising.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

#: Keys that carry conversation content in any of the three protocols; everything else
#: (model, sampling, stream, token limits, metadata) may change between identical asks.
_CONTENT_KEYS: Final = ("system", "instructions", "messages", "input", "tools")
#: A bound on the values hashed, far above any request the proxy accepts: shared containers in
#: Python-built junk could otherwise make the walk exponential.
_MAX_NODES: Final = 1_000_000
#: Cache breakpoints move as a conversation grows and say nothing about what was asked.
_VOLATILE_KEYS: Final = frozenset({"cache_control"})


class _Raw(bytes):
    """A token to emit as is (distinct from a ``bytes`` value inside the data)."""


@dataclass(frozen=True, slots=True)
class _Leave:
    """Marks the end of a container: it leaves the path walked from the root."""

    container_id: int
    close: bytes


def _str_token(tag: bytes, s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return tag + str(len(b)).encode() + b":" + b


def stable_hash(
    value: Any, *, skip_keys: frozenset[str] = _VOLATILE_KEYS, max_nodes: int = _MAX_NODES
) -> str:
    """A hex digest of ``value`` that ignores dict key order and the keys in ``skip_keys``."""
    h = hashlib.sha256()
    stack: list[Any] = [value]
    # Containers between the root and the current value: meeting one again is a cycle. A container
    # merely shared by two branches is hashed in full each time, as its JSON text would be.
    path: set[int] = set()
    nodes = 0
    while stack:
        nodes += 1
        if nodes > max_nodes:
            h.update(b"!truncated")
            break
        v = stack.pop()
        if type(v) is _Raw:
            h.update(v)
        elif type(v) is _Leave:
            path.discard(v.container_id)
            h.update(v.close)
        elif v is None:
            h.update(b"n")
        elif v is True or v is False:
            h.update(b"t" if v else b"f")
        elif isinstance(v, str):
            h.update(_str_token(b"s", v))
        elif isinstance(v, int | float):
            h.update(b"d" + repr(v).encode() + b";")
        elif isinstance(v, dict | list | tuple):
            if id(v) in path:
                h.update(b"^")  # a cycle: JSON never makes one
                continue
            path.add(id(v))
            if isinstance(v, dict):
                h.update(b"{")
                stack.append(_Leave(id(v), b"}"))
                for k, item in sorted(((str(k), item) for k, item in v.items()), key=lambda kv: kv[0])[::-1]:
                    if k not in skip_keys:
                        stack.append(item)
                        stack.append(_Raw(_str_token(b"k", k)))
            else:
                h.update(b"[")
                stack.append(_Leave(id(v), b"]"))
                stack.extend(reversed(v))
        elif isinstance(v, bytes | bytearray):
            h.update(b"b" + str(len(v)).encode() + b":" + bytes(v))
        else:
            h.update(_str_token(b"?", type(v).__name__))
    return h.hexdigest()


def request_fingerprint(protocol: str, body: Any) -> str:
    """A hash of what a request asks, independent of the model it names.

    Two requests of a task with the same fingerprint mean the agent sent the same thing again.
    """
    if isinstance(body, dict):
        content: Any = {k: body[k] for k in _CONTENT_KEYS if k in body}
    else:
        content = body
    return stable_hash([str(protocol), content])
