"""Stable hashes of JSON-like values: tool-call identity and the identical-request check.

The walk is iterative, so a deeply nested or self-referencing body cannot exhaust the stack,
and any value hashes without raising.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

#: Keys that carry conversation content in any of the three protocols; everything else
#: (model, sampling, stream, token limits, metadata) may change between identical asks.
_CONTENT_KEYS: Final = ("system", "instructions", "messages", "input", "tools")
#: Cache breakpoints move as a conversation grows and say nothing about what was asked.
_VOLATILE_KEYS: Final = frozenset({"cache_control"})


class _Raw(bytes):
    """A token to emit as is (distinct from a ``bytes`` value inside the data)."""


_CLOSE_OBJ: Final = _Raw(b"}")
_CLOSE_ARR: Final = _Raw(b"]")


def _str_token(tag: bytes, s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return tag + str(len(b)).encode() + b":" + b


def stable_hash(value: Any, *, skip_keys: frozenset[str] = _VOLATILE_KEYS) -> str:
    """A hex digest of ``value`` that ignores dict key order and the keys in ``skip_keys``."""
    h = hashlib.sha256()
    stack: list[Any] = [value]
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if type(v) is _Raw:
            h.update(v)
        elif v is None:
            h.update(b"n")
        elif v is True or v is False:
            h.update(b"t" if v else b"f")
        elif isinstance(v, str):
            h.update(_str_token(b"s", v))
        elif isinstance(v, int | float):
            h.update(b"d" + repr(v).encode() + b";")
        elif isinstance(v, dict | list | tuple):
            if id(v) in seen:
                h.update(b"^")  # a shared or cyclic container: JSON never makes one
                continue
            seen.add(id(v))
            if isinstance(v, dict):
                h.update(b"{")
                stack.append(_CLOSE_OBJ)
                for k, item in sorted(((str(k), item) for k, item in v.items()), key=lambda kv: kv[0])[::-1]:
                    if k not in skip_keys:
                        stack.append(item)
                        stack.append(_Raw(_str_token(b"k", k)))
            else:
                h.update(b"[")
                stack.append(_CLOSE_ARR)
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
