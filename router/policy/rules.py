"""Data-only routing conditions over request features (Portkey-style), never evaluated as code.

A condition is a mapping::

    {prompt_tokens: {$gt: 100000}}            # comparison on a field
    {model: claude-haiku}                      # a bare value means $eq
    {headers.x-team: {$regex: "^infra"}}       # header names are matched lower-case
    {$or: [{a: 1}, {$not: {b: {$in: [x, y]}}}]}

Several fields in one mapping, and several operators on one field, are ANDed. Operators are a
fixed set: ``$eq $in $gt $gte $lt $lte $regex`` on fields, ``$and $or $not`` on conditions.
Everything is checked by ``compile_condition`` at load time; ``Condition.matches`` then never
raises: a missing field or a value of the wrong type makes that comparison False.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.errors import ConfigError
from router.policy.interpolate import format_path

__all__ = ["MAX_DEPTH", "MAX_REGEX_LENGTH", "REGEX_INPUT_LIMIT", "Condition", "compile_condition"]

MAX_DEPTH = 16
MAX_REGEX_LENGTH = 512
#: ``$regex`` looks at no more than this many characters of a value (bounds the cost per request).
REGEX_INPUT_LIMIT = 10_000

_FIELD_OPS = ("$eq", "$in", "$gt", "$gte", "$lt", "$lte", "$regex")
_LOGICAL_OPS = ("$and", "$or", "$not")
_ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}
# Field parts start with a letter, which also keeps dunder names like __import__ out.
_SEGMENT = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# An HTTP header name is an RFC 9110 token; it may itself contain dots.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_MISSING = object()

Features = Mapping[str, Any]
_Test = Callable[[Features], bool]
_Check = Callable[[Any], bool]


class Condition:
    """A compiled condition: evaluate with ``matches``; ``fields`` lists the names it reads."""

    __slots__ = ("_fields", "_test", "where")

    def __init__(self, test: _Test, fields: frozenset[str], where: str) -> None:
        self._test = test
        self._fields = fields
        self.where = where

    def matches(self, features: Features) -> bool:
        return self._test(features)

    def fields(self) -> set[str]:
        return set(self._fields)

    def __repr__(self) -> str:
        return f"<Condition {self.where} fields={sorted(self._fields)}>"


def compile_condition(raw: Any, *, where: str, kinds: Mapping[str, str] | None = None) -> Condition:
    """Validate and compile ``raw``; errors are ``ConfigError`` located by ``where`` + path.

    ``where`` locates the condition itself, e.g. ``"policies/default.yaml: rules[0].when"``;
    inner paths are appended to it with a dot (or after ``": "`` when ``where`` is just a file).
    ``kinds``: what each known field holds ("number", "boolean", "string"), to refuse a value it
    can never equal or an ordering it cannot take.
    """
    compiler = _Compiler(where, kinds or {})
    test = compiler.condition(raw, [], 1)
    return Condition(test, frozenset(compiler.fields), where)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool) or _is_number(value)


def _eq_key(value: Any) -> tuple[str, Any] | None:
    """A hashable key under which two values are equal exactly when ``$eq`` says so.

    Python has ``True == 1``; the tag keeps booleans apart from numbers (and 1 == 1.0 holds).
    """
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z", None)
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _all(tests: Sequence[_Test]) -> _Test:
    if len(tests) == 1:
        return tests[0]

    def test(features: Features) -> bool:
        return all(t(features) for t in tests)

    return test


def _any(tests: Sequence[_Test]) -> _Test:
    def test(features: Features) -> bool:
        return any(t(features) for t in tests)

    return test


def _negate(inner: _Test) -> _Test:
    return lambda features: not inner(features)


def _getter(keys: tuple[str, ...]) -> Callable[[Features], Any]:
    first, rest = keys[0], keys[1:]

    def get(features: Features) -> Any:
        value = features.get(first, _MISSING)
        for key in rest:
            if not isinstance(value, Mapping):
                return _MISSING
            value = value.get(key, _MISSING)
        return value

    return get


#: "prompt_tokens: '>10000'" meant {$gt: 10000}.
_WRITTEN_ORDERING = re.compile(r"\s*(>=|<=|>|<)\s*(\d+(?:\.\d+)?)\s*")
_ORDERING_OF = {">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}


class _Compiler:
    def __init__(self, where: str, kinds: Mapping[str, str]) -> None:
        self.where = where
        self.kinds = kinds
        self.fields: set[str] = set()

    def typed(self, name: str, op: str, arg: Any, path: list[str | int]) -> None:
        """A value the field can never equal, or an ordering of a field that is no number: a rule
        "prompt_tokens: '>10000'" loaded and never fired (a number never equals a string)."""
        kind = self.kinds.get(name)
        if kind is None:
            return
        if op in _ORDERING:
            if kind != "number":
                raise self.error(path, f"{name} is a {kind}: {op} compares numbers")
            return
        if op not in ("$eq", "$in") or (op == "$in" and not isinstance(arg, list | tuple)):
            return  # the operator's own check says what is wrong with the value
        for value in arg if op == "$in" else [arg]:
            fits = {
                "number": _is_number(value),
                "boolean": isinstance(value, bool),
                "string": isinstance(value, str),
            }
            if value is None or fits[kind]:
                continue
            hint = ""
            if kind == "number" and isinstance(value, str) and (m := _WRITTEN_ORDERING.fullmatch(value)):
                hint = f" (write {{{_ORDERING_OF[m.group(1)]}: {m.group(2)}}})"
            raise self.error(path, f"{name} is a {kind}: {value!r} never equals it{hint}")

    def error(self, path: Sequence[str | int], message: str) -> ConfigError:
        inner = format_path(path)
        if not inner:
            location = self.where
        elif inner.startswith("["):
            location = self.where + inner
        elif ": " in self.where:
            location = f"{self.where}.{inner}"
        else:
            location = f"{self.where}: {inner}"
        return ConfigError(f"{location}: {message}")

    def condition(self, raw: Any, path: list[str | int], depth: int) -> _Test:
        if depth > MAX_DEPTH:
            raise self.error(path, f"conditions nested deeper than {MAX_DEPTH} levels")
        if not isinstance(raw, Mapping):
            raise self.error(path, f"expected a condition (a mapping), got {_kind(raw)}")
        if not raw:
            raise self.error(path, "empty condition")
        tests: list[_Test] = []
        for key, value in raw.items():
            if not isinstance(key, str):
                raise self.error(path, f"field names must be strings, got {key!r}")
            if key.startswith("$"):
                tests.append(self.logical(key, value, [*path, key], depth))
            else:
                tests.append(self.field(key, value, [*path, key]))
        return _all(tests)

    def logical(self, op: str, value: Any, path: list[str | int], depth: int) -> _Test:
        if op in ("$and", "$or"):
            if not isinstance(value, list | tuple) or not value:
                raise self.error(path, f"expected a non-empty list of conditions, got {_kind(value)}")
            tests = [self.condition(item, [*path, i], depth + 1) for i, item in enumerate(value)]
            return _all(tests) if op == "$and" else _any(tests)
        if op == "$not":
            return _negate(self.condition(value, path, depth + 1))
        if op in _FIELD_OPS:
            raise self.error(path, f"{op} applies to a field: write {{<field>: {{{op}: ...}}}}")
        raise self.error(
            path,
            f"unknown operator {op} (a condition holds field names and {', '.join(_LOGICAL_OPS)})",
        )

    def field(self, name: str, spec: Any, path: list[str | int]) -> _Test:
        parsed = _parse_field(name)
        if parsed is None:
            raise self.error(
                path,
                "invalid field name: use dotted names whose parts start with a letter and hold "
                "letters, digits, '_' or '-' (headers.<header-name> for a request header)",
            )
        canonical, keys = parsed
        self.fields.add(canonical)
        checks: list[_Check]
        if isinstance(spec, Mapping):
            if not spec:
                raise self.error(path, "no operators given")
            for op, arg in spec.items():
                self.typed(canonical, op, arg, [*path, op])
            checks = [self.operator(op, arg, [*path, op]) for op, arg in spec.items()]
        else:
            self.typed(canonical, "$eq", spec, path)
            checks = [self.operator("$eq", spec, path)]
        get = _getter(keys)
        if len(checks) == 1:
            check = checks[0]

            def test_one(features: Features) -> bool:
                value = get(features)
                return value is not _MISSING and check(value)

            return test_one

        def test_all(features: Features) -> bool:
            value = get(features)
            return value is not _MISSING and all(c(value) for c in checks)

        return test_all

    def operator(self, op: Any, arg: Any, path: list[str | int]) -> _Check:
        if op == "$eq":
            return _eq_check(self.scalar(arg, path))
        if op == "$in":
            if not isinstance(arg, list | tuple):
                raise self.error(path, f"expected a list, got {_kind(arg)}")
            keys = {_eq_key(self.scalar(item, [*path, i])) for i, item in enumerate(arg)}
            return lambda value: _eq_key(value) in keys
        if op in _ORDERING:
            if not _is_number(arg) or math.isnan(arg):
                raise self.error(path, f"expected a number, got {_kind(arg)}")
            compare, bound = _ORDERING[op], arg
            return lambda value: _is_number(value) and compare(value, bound)
        if op == "$regex":
            return self.regex(arg, path)
        if op in _LOGICAL_OPS:
            raise self.error(path, f"{op} combines whole conditions: write {{{op}: ...}} around the field")
        if isinstance(op, str) and op.startswith("$"):
            raise self.error(path, f"unknown operator {op} (fields take {', '.join(_FIELD_OPS)})")
        hint = (
            f" (did you mean '${op}'?)" if f"${op}" in _FIELD_OPS else ""
        )  # {gt: 10}: YAML wants no $ elsewhere
        raise self.error(path, f"expected an operator ({', '.join(_FIELD_OPS)}), got {op!r}{hint}")

    def scalar(self, value: Any, path: list[str | int]) -> Any:
        if isinstance(value, list | tuple):
            raise self.error(path, "a list is not a value to compare with: use {$in: [...]} for membership")
        if not _is_scalar(value):
            raise self.error(path, f"expected a string, number, boolean or null, got {_kind(value)}")
        if isinstance(value, float) and math.isnan(value):
            raise self.error(path, "NaN equals nothing")
        return value

    def regex(self, arg: Any, path: list[str | int]) -> _Check:
        if not isinstance(arg, str):
            raise self.error(path, f"expected a regular expression string, got {_kind(arg)}")
        if len(arg) > MAX_REGEX_LENGTH:
            raise self.error(path, f"regular expression longer than {MAX_REGEX_LENGTH} characters")
        try:
            pattern = re.compile(arg)
        except re.error as exc:
            raise self.error(path, f"invalid regular expression: {exc}") from None
        search = pattern.search

        def check(value: Any) -> bool:
            if isinstance(value, str):
                return search(value[:REGEX_INPUT_LIMIT]) is not None
            # Containers are skipped rather than stringified: str() of a big one costs more
            # than the whole routing decision.
            if not _is_scalar(value):
                return False
            try:
                text = str(value)
            except ValueError:  # an int beyond sys.get_int_max_str_digits()
                return False
            return search(text[:REGEX_INPUT_LIMIT]) is not None

        return check


def _eq_check(literal: Any) -> _Check:
    if literal is None or isinstance(literal, bool):
        # Singletons: identity is exact and keeps True apart from 1.
        return lambda value: value is literal
    if isinstance(literal, str):
        return lambda value: isinstance(value, str) and value == literal
    return lambda value: _is_number(value) and value == literal


def _parse_field(name: str) -> tuple[str, tuple[str, ...]] | None:
    """Split a field name into lookup keys, or None when it is not a valid name."""
    head, dot, rest = name.partition(".")
    if head == "headers" and dot:
        if not _HEADER_NAME.fullmatch(rest):
            return None
        header = rest.lower()
        return f"headers.{header}", ("headers", header)
    keys = tuple(name.split("."))
    if all(_SEGMENT.fullmatch(key) for key in keys):
        return name, keys
    return None
