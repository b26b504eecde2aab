"""${VAR} interpolation of YAML-loaded trees, and field-path formatting."""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import yaml

from router.errors import ConfigError
from router.policy.interpolate import format_path, interpolate

ENV = {"HOST": "127.0.0.1", "PORT": "8080", "EMPTY": "", "_U1": "u", "TRICKY": "${HOST}"}


def expand(value: Any, env: dict[str, str] | None = None) -> Any:
    return interpolate(value, ENV if env is None else env, source="policies/x.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://${HOST}:${PORT}/v1", "http://127.0.0.1:8080/v1"),
        ("${HOST}", "127.0.0.1"),
        ("${_U1}", "u"),
        ("${MISSING:-fallback}", "fallback"),
        ("${HOST:-fallback}", "127.0.0.1"),
        ("${MISSING:-}", ""),
        ("${EMPTY:-used when empty}", "used when empty"),
        ("${EMPTY}", ""),
        ("${MISSING:-a b:c/d?e=f}", "a b:c/d?e=f"),
        ("$${HOST}", "${HOST}"),
        ("cost: $$${HOST}", "cost: $${HOST}"),
        ("$HOST stays", "$HOST stays"),
        ("price $5 and $$", "price $5 and $$"),
        ("no references", "no references"),
        ("", ""),
    ],
)
def test_expansion(text: str, expected: str) -> None:
    assert expand(text) == expected


def test_substituted_values_are_not_expanded_again() -> None:
    assert expand("${TRICKY}") == "${HOST}"
    assert expand("${MISSING:-${HOST}}") == "${HOST}"  # the default ends at the first '}'


def test_tree_is_copied_and_only_string_values_change() -> None:
    tree: dict[Any, Any] = {
        "models": [
            {"id": "local", "api_base": "http://${HOST}:${PORT}", "timeout": 30, "stream": True},
            {"id": "${HOST}", "tags": ["${PORT}", None, 1.5]},
        ],
        "${HOST}": "key untouched",
        7: "${PORT}",
    }
    original = copy.deepcopy(tree)
    out = expand(tree)
    assert out == {
        "models": [
            {"id": "local", "api_base": "http://127.0.0.1:8080", "timeout": 30, "stream": True},
            {"id": "127.0.0.1", "tags": ["8080", None, 1.5]},
        ],
        "${HOST}": "key untouched",
        7: "8080",
    }
    assert tree == original
    assert out is not tree and out["models"] is not tree["models"]


def test_tuples_stay_tuples_and_env_may_be_any_mapping() -> None:
    env = types.MappingProxyType({"A": "1"})
    assert interpolate(("${A}", ["${A}"]), env, source="s") == ("1", ["1"])


def test_scalars_pass_through() -> None:
    for value in (None, 3, 2.5, True):
        assert expand(value) is value


def test_unset_variable_names_file_and_path() -> None:
    tree = {"models": [{}, {}, {"api_base": "${ROUTER_LOCAL_UPSTREAM}"}]}
    with pytest.raises(ConfigError) as info:
        expand(tree, {})
    assert str(info.value) == (
        "policies/x.yaml: models[2].api_base: environment variable ROUTER_LOCAL_UPSTREAM is not set "
        "(use ${ROUTER_LOCAL_UPSTREAM:-default} for a default)"
    )


def test_unset_variable_at_the_top_level() -> None:
    with pytest.raises(ConfigError) as info:
        expand("${NOPE}", {})
    assert str(info.value).startswith("policies/x.yaml: environment variable NOPE is not set")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("${", "'${' (no closing '}')"),
        ("x ${HOST", "'${HOST' (no closing '}')"),
        ("${1X}", "'${1X}'"),
        ("${}", "'${}'"),
        ("${A-B}", "'${A-B}'"),
        ("${A:?required}", "'${A:?required}'"),
        ("${A.B}", "'${A.B}'"),
        ("${ HOST }", "'${ HOST }'"),
        ("ok ${HOST} then ${", "'${' (no closing '}')"),
    ],
)
def test_malformed_references(text: str, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        expand({"routes": [{"name": text}]})
    message = str(info.value)
    assert message.startswith(f"policies/x.yaml: routes[0].name: malformed variable reference {shown}:")
    assert "${NAME:-default}" in message


def test_malformed_reference_is_shortened() -> None:
    with pytest.raises(ConfigError) as info:
        expand("${" + "-" * 500 + "}")
    assert "malformed variable reference '${-----" in str(info.value)
    assert len(str(info.value)) < 300


def test_recursive_yaml_anchor_is_an_error() -> None:
    tree = yaml.safe_load("a: &x [1, *x]")
    with pytest.raises(ConfigError, match=r"^policies/x\.yaml: a\[1\]: .*refers to itself"):
        expand(tree)


def test_shared_alias_is_fine() -> None:
    tree = yaml.safe_load("base: &b {url: '${HOST}'}\nother: *b\n")
    assert expand(tree) == {"base": {"url": "127.0.0.1"}, "other": {"url": "127.0.0.1"}}


def test_absurd_depth_is_an_error() -> None:
    tree: Any = "x"
    for _ in range(150):
        tree = [tree]
    with pytest.raises(ConfigError, match="nested deeper than 100"):
        expand(tree)


def test_error_path_is_restored_after_siblings() -> None:
    tree = {"a": [{"b": "fine"}, "${HOST}"], "c": {"d": "${NOPE}"}}
    with pytest.raises(ConfigError, match=r"^policies/x\.yaml: c\.d: environment variable NOPE"):
        expand(tree)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([], ""),
        (["models", 2, "api_base"], "models[2].api_base"),
        (["rules", 0, "when", "prompt_tokens", "$gt"], "rules[0].when.prompt_tokens.$gt"),
        ([0, "x"], "[0].x"),
        (["m", 1, 2], "m[1][2]"),
        (["when", "headers.x-team", "$regex"], "when.headers.x-team.$regex"),
        (["a", "two words"], "a['two words']"),
        (["a", ""], "a['']"),
        (["a", "x[0]"], "a['x[0]']"),
        (("tuple", 3), "tuple[3]"),
    ],
)
def test_format_path(parts: list[str | int], expected: str) -> None:
    assert format_path(parts) == expected


def test_format_path_does_not_treat_bools_as_indexes() -> None:
    assert format_path(["a", True]) == "a.True"
