"""Issue 34 #6: no class on the request's path takes more than six collaborators.

The rule, precisely: for every class defined in ``router.http``, ``router.forward`` and
``router.policy`` that has an ``__init__`` of its own (a dataclass's generated one included), each
parameter but ``self`` is resolved from its annotation (``typing.get_type_hints``) and counted as
a *collaborator* unless its type is a value:

* a builtin scalar (``int``, ``float``, ``str``, ``bool``, ``bytes``, ``None``), a ``Path`` or a
  ``Literal``;
* a builtin or abstract container (``list``, ``dict``, ``set``, ``frozenset``, ``tuple``,
  ``Mapping``, ``Sequence``, ...) whose arguments are all values (a bare container counts as a
  value; ``dict[str, Backend]`` only if ``Backend`` is one);
* a dataclass, a named tuple, an ``Enum``, a pydantic model or an exception: records the class
  reads, not objects it hands work to;
* a union of values (``X | None`` is a value when ``X`` is).

Everything else is a collaborator: an instance of any other class (a store, a writer, a runtime
holder, ``random.Random``), a ``Protocol``, a ``Callable`` (behaviour handed in), ``Any`` (the
annotation says nothing, so it is counted). A class with seven is refused: split it, or group what
it uses into one object with a name. No exceptions list.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import importlib
import inspect
import pathlib
import pkgutil
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pydantic

MAX_COLLABORATORS = 6
PACKAGES = ("router.http", "router.forward", "router.policy")

_VALUE_CLASSES: frozenset[Any] = frozenset(
    {
        int, float, str, bool, bytes, type(None), pathlib.Path,
        list, dict, set, frozenset, tuple,
        collections.abc.Mapping, collections.abc.Sequence, collections.abc.Set,
        collections.abc.Collection, collections.abc.Iterable,
    }
)  # fmt: skip


def is_value(t: Any) -> bool:
    """Whether a resolved annotation is a value (see the module's docstring), not a collaborator."""
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return all(is_value(a) for a in typing.get_args(t))
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return is_value(typing.get_args(t)[0])
    if origin is not None:  # a parametrised generic: list[str], Callable[[], None], ...
        return origin in _VALUE_CLASSES and all(a is Ellipsis or is_value(a) for a in typing.get_args(t))
    if t in _VALUE_CLASSES:
        return True
    if not isinstance(t, type):
        return False  # Any, a TypeVar, a string that did not resolve
    if dataclasses.is_dataclass(t) or issubclass(t, (enum.Enum, BaseException, pydantic.BaseModel)):
        return True
    return issubclass(t, tuple) and hasattr(t, "_fields")  # a named tuple


def collaborators(cls: type) -> list[str]:
    """The names of ``cls.__init__``'s parameters that are collaborators."""
    init = cls.__dict__["__init__"]
    hints = typing.get_type_hints(init, include_extras=True)
    params = [
        p
        for p in inspect.signature(init).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    return [p.name for p in params if not is_value(hints.get(p.name, Any))]


def classes(packages: tuple[str, ...] = PACKAGES) -> Iterator[type]:
    """Every class defined in ``packages`` (and their subpackages) with an ``__init__`` of its own."""
    for package in packages:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if isinstance(obj, type) and obj.__module__ == module.__name__ and "__init__" in obj.__dict__:
                    yield obj


def too_many(found: Iterator[type]) -> dict[str, list[str]]:
    return {
        f"{cls.__module__}.{cls.__qualname__}": names
        for cls in found
        if len(names := collaborators(cls)) > MAX_COLLABORATORS
    }


class _Store:
    def read(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class _Limits:
    rps: float


class _Crowded:
    """Seven collaborators among values: what the check refuses."""

    def __init__(
        self, a: _Store, b: _Store, c: _Store | None, d: Callable[[], None], e: Any, f: Mapping[str, _Store],
        g: list[_Store], limits: _Limits, name: str, sizes: dict[str, tuple[int, ...]], flag: bool = False,
    ) -> None:  # fmt: skip
        pass


class _Six:
    def __init__(
        self, a: _Store, b: _Store, c: _Store, d: _Store, e: _Store, f: _Store, limits: _Limits
    ) -> None:
        pass


def test_the_check_counts_objects_and_behaviour_not_values() -> None:
    assert collaborators(_Crowded) == ["a", "b", "c", "d", "e", "f", "g"]
    assert too_many(iter([_Crowded, _Six])) == {f"{__name__}._Crowded": ["a", "b", "c", "d", "e", "f", "g"]}


def test_the_check_reads_the_request_path() -> None:
    found = {f"{c.__module__}.{c.__qualname__}" for c in classes()}
    assert {
        "router.http.proxy.Proxy",
        "router.forward.execute.Executor",
        "router.policy.pipeline.Pipeline",
    } <= found
    assert len(collaborators(importlib.import_module("router.http.proxy").Proxy)) == 6


def test_no_class_takes_more_than_six_collaborators() -> None:
    assert too_many(classes()) == {}
