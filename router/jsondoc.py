"""Reading a machine-written JSON document (the learned artifact) field by field, so that any
bad value is refused in one line naming the file and the field's path (``models.m.platt[1]``),
never with a traceback from deep inside whatever read it next."""

from __future__ import annotations

import math
from typing import NoReturn

from router.digits import whole_number
from router.errors import ConfigError


class Node:
    """One value of the document and where it is."""

    __slots__ = ("path", "source", "value")

    def __init__(self, value: object, source: str, path: str = "") -> None:
        self.value = value
        self.source = source
        self.path = path

    def fail(self, expected: str) -> NoReturn:
        raise ConfigError(
            f"{self.source}: {self.path or 'the document'}: expected {expected}, got {_brief(self.value)}"
        )

    def get(self, key: str) -> Node | None:
        """The member ``key`` of this object (None: absent or null)."""
        if not isinstance(self.value, dict):
            self.fail("an object")
        value = self.value.get(key)
        return None if value is None else Node(value, self.source, f"{self.path}.{key}" if self.path else key)

    def need(self, key: str) -> Node:
        got = self.get(key)
        if got is None:
            raise ConfigError(f"{self.source}: {self.path + '.' if self.path else ''}{key}: missing")
        return got

    def mapping(self) -> dict[str, Node]:
        if not isinstance(self.value, dict):
            self.fail("an object")
        prefix = f"{self.path}." if self.path else ""
        return {str(k): Node(v, self.source, f"{prefix}{k}") for k, v in self.value.items()}

    def items(self, size: int | None = None) -> list[Node]:
        if not isinstance(self.value, list) or (size is not None and len(self.value) != size):
            self.fail("a list" if size is None else f"a list of {size}")
        return [Node(v, self.source, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def number(self, low: float = -math.inf, high: float = math.inf, *, open_: bool = False) -> float:
        """A number in [low, high] (``open_``: in (low, high)); true and false are not numbers."""
        v = self.value
        anything = math.isinf(low) and math.isinf(high)
        where = "" if anything else f" in {'(' if open_ else '['}{low:g}, {high:g}{')' if open_ else ']'}"
        if isinstance(v, bool) or not isinstance(v, int | float):
            self.fail("a number" + where)
        inside = low < v < high if open_ else low <= v <= high
        if not inside:
            self.fail("a number" + where)
        return float(v)

    def whole(self, low: int = 0) -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < low:
            self.fail(f"a whole number ≥ {low}")
        return int(v)

    def text(self) -> str:
        if not isinstance(self.value, str):
            self.fail("a string")
        return self.value

    def numbers(self, size: int | None = None) -> tuple[float, ...]:
        v = self.value
        # A model's weights are thousands of numbers: checked in one pass, a Node only to name a bad one.
        if isinstance(v, list) and (size is None or len(v) == size) and {type(x) for x in v} <= {float, int}:
            return tuple(map(float, v))
        return tuple(n.number() for n in self.items(size))


#: A retry limit read from a key: far above any real one, a bound for int().
MAX_ATTEMPTS_KEY = 1_000_000


def attempts_key(key: str, node: Node) -> int:
    """A retry limit used as the key of ``node`` (JSON keys are strings: ``"2"``)."""
    limit = whole_number(key, MAX_ATTEMPTS_KEY)
    if not limit:
        raise ConfigError(
            f"{node.source}: {node.path}: expected a retry limit (a whole number ≥ 1) as the key"
        )
    return limit


def _brief(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
