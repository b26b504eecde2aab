"""Data-only rule conditions: operators, nesting, missing fields, and load-time errors."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from router.errors import ConfigError
from router.policy.rules import MAX_DEPTH, Condition, compile_condition

WHERE = "policies/default.yaml: rules[0].when"

FEATURES: dict[str, Any] = {
    "protocol": "anthropic",
    "requested_model": "claude-sonnet-4",
    "prompt_tokens": 12_000,
    "max_output_tokens": None,
    "tools": True,
    "n_tools": 1,
    "ratio": 0.5,
    "headers": {"x-team": "infra-core", "x.dotted": "yes"},
    "metadata": {"user": {"id": "u-42", "tier": 2}},
}


def cond(raw: Any) -> Condition:
    return compile_condition(raw, where=WHERE)


def matches(raw: Any, features: dict[str, Any] | None = None) -> bool:
    return cond(raw).matches(FEATURES if features is None else features)


def error_of(raw: Any, where: str = WHERE) -> str:
    with pytest.raises(ConfigError) as info:
        compile_condition(raw, where=where)
    return str(info.value)


# --- operators -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"protocol": "anthropic"}, True),
        ({"protocol": "openai"}, False),
        ({"protocol": {"$eq": "anthropic"}}, True),
        ({"prompt_tokens": 12_000}, True),
        ({"prompt_tokens": 12_000.0}, True),
        ({"prompt_tokens": "12000"}, False),
        ({"tools": True}, True),
        ({"tools": False}, False),
        ({"n_tools": True}, False),  # True == 1 in Python, not here
        ({"tools": 1}, False),
        ({"max_output_tokens": None}, True),
        ({"n_tools": None}, False),
        ({"ratio": 0.5}, True),
    ],
)
def test_eq(raw: dict[str, Any], expected: bool) -> None:
    assert matches(raw) is expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"protocol": {"$in": ["openai", "anthropic"]}}, True),
        ({"protocol": {"$in": ["openai", "responses"]}}, False),
        ({"prompt_tokens": {"$in": [1, 12_000]}}, True),
        ({"prompt_tokens": {"$in": [12_000.0]}}, True),
        ({"prompt_tokens": {"$in": ["12000"]}}, False),
        ({"n_tools": {"$in": [True]}}, False),
        ({"tools": {"$in": [1]}}, False),
        ({"tools": {"$in": [True, "x"]}}, True),
        ({"max_output_tokens": {"$in": [None]}}, True),
        ({"protocol": {"$in": []}}, False),
        ({"headers": {"$in": ["x"]}}, False),  # a mapping value is never a member
    ],
)
def test_in(raw: dict[str, Any], expected: bool) -> None:
    assert matches(raw) is expected


@pytest.mark.parametrize(
    ("op", "bound", "expected"),
    [
        ("$gt", 11_999, True),
        ("$gt", 12_000, False),
        ("$gte", 12_000, True),
        ("$gte", 12_000.5, False),
        ("$lt", 12_001, True),
        ("$lt", 12_000, False),
        ("$lte", 12_000, True),
        ("$lte", 11_999.9, False),
        ("$gt", float("-inf"), True),
        ("$lt", float("inf"), True),
    ],
)
def test_ordering(op: str, bound: float, expected: bool) -> None:
    assert matches({"prompt_tokens": {op: bound}}) is expected


@pytest.mark.parametrize("value", ["13000", True, None, [13_000], {"n": 13_000}, float("nan")])
@pytest.mark.parametrize("op", ["$gt", "$gte", "$lt", "$lte"])
def test_ordering_on_wrong_types_is_false(op: str, value: Any) -> None:
    assert matches({"x": {op: 0}}, {"x": value}) is False


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("^infra", "infra-core", True),
        ("core$", "infra-core", True),
        ("^core", "infra-core", False),  # search, anchored by the pattern only
        ("(?i)INFRA", "infra-core", True),
        ("^12", 12_000, True),
        ("^True$", True, True),
        ("^None$", None, True),
        ("x", ["x"], False),
        ("x", {"x": 1}, False),
    ],
)
def test_regex(pattern: str, value: Any, expected: bool) -> None:
    assert matches({"f": {"$regex": pattern}}, {"f": value}) is expected


def test_regex_reads_only_the_first_10000_characters() -> None:
    condition = cond({"f": {"$regex": "needle"}})
    assert condition.matches({"f": "needle" + "a" * 20_000})
    assert not condition.matches({"f": "a" * 10_000 + "needle"})
    assert condition.matches({"f": "a" * 9_994 + "needle"})


def test_regex_on_an_enormous_int_does_not_raise() -> None:
    assert matches({"f": {"$regex": "1"}}, {"f": 10**5000}) is False


def test_operators_on_one_field_are_anded() -> None:
    window = cond({"prompt_tokens": {"$gte": 10_000, "$lt": 20_000}})
    assert window.matches({"prompt_tokens": 10_000})
    assert window.matches({"prompt_tokens": 19_999})
    assert not window.matches({"prompt_tokens": 20_000})
    assert not window.matches({"prompt_tokens": 9_999})


def test_fields_in_one_mapping_are_anded() -> None:
    assert matches({"protocol": "anthropic", "tools": True})
    assert not matches({"protocol": "anthropic", "tools": False})
    assert not matches({"protocol": "openai", "tools": True})


def test_logical_operators_and_nesting() -> None:
    assert matches({"$and": [{"protocol": "anthropic"}, {"prompt_tokens": {"$gt": 10}}]})
    assert not matches({"$and": [{"protocol": "anthropic"}, {"prompt_tokens": {"$gt": 10**6}}]})
    assert matches({"$or": [{"protocol": "openai"}, {"prompt_tokens": {"$gt": 10}}]})
    assert not matches({"$or": [{"protocol": "openai"}, {"tools": False}]})
    assert matches({"$not": {"protocol": "openai"}})
    assert not matches({"$not": {"protocol": "anthropic"}})
    nested = {
        "$or": [
            {"$and": [{"protocol": "openai"}, {"tools": True}]},
            {"$not": {"$or": [{"n_tools": {"$gt": 5}}, {"headers.x-team": {"$regex": "^web"}}]}},
        ],
        "prompt_tokens": {"$lt": 50_000},
    }
    assert matches(nested)
    assert not matches(nested, {**FEATURES, "headers": {"x-team": "web"}})
    assert not matches(nested, {**FEATURES, "prompt_tokens": 60_000})


def test_missing_fields_make_comparisons_false() -> None:
    for raw in (
        {"absent": "x"},
        {"absent": None},
        {"absent": {"$in": [None, "x"]}},
        {"absent": {"$gt": 0}},
        {"absent": {"$lt": 0}},
        {"absent": {"$regex": ".*"}},
        {"headers.x-absent": {"$regex": ""}},
        {"metadata.user.missing": 1},
        {"protocol.deeper": "x"},  # protocol is a string, not a mapping
    ):
        assert matches(raw) is False, raw
        # $not inverts the comparison, so a missing field satisfies it.
        assert matches({"$not": raw}) is True, raw


def test_dotted_lookup_and_headers() -> None:
    assert matches({"metadata.user.id": "u-42"})
    assert matches({"metadata.user.tier": {"$gte": 2}})
    assert matches({"headers.x-team": {"$regex": "^infra"}})
    assert matches({"headers.X-Team": "infra-core"})  # header names compare lower-case
    assert matches({"headers.x.dotted": "yes"})  # split on the first dot only


def test_headers_may_be_any_mapping() -> None:
    class CaseInsensitive(dict[str, str]):
        def get(self, key: str, default: Any = None) -> Any:
            return super().get(key.lower(), default)

    assert matches({"headers.x-team": "a"}, {"headers": CaseInsensitive({"x-team": "a"})})


def test_fields_lists_every_referenced_name() -> None:
    condition = cond(
        {
            "protocol": "openai",
            "$or": [{"prompt_tokens": {"$gt": 1}}, {"$not": {"headers.X-Team": "a"}}],
            "$and": [{"metadata.user.id": "u"}],
        }
    )
    assert condition.fields() == {"protocol", "prompt_tokens", "headers.x-team", "metadata.user.id"}
    condition.fields().add("mutated")
    assert "mutated" not in condition.fields()


def test_matches_returns_real_bools() -> None:
    assert cond({"$or": [{"a": 1}, {"b": 2}]}).matches({"b": 2}) is True
    assert cond({"a": {"$regex": "x"}}).matches({"a": "x"}) is True


# --- load-time errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"prompt_tokens": {"$gt": "100"}}, "rules[0].when.prompt_tokens.$gt: expected a number, got str"),
        ({"prompt_tokens": {"$lte": True}}, "rules[0].when.prompt_tokens.$lte: expected a number, got bool"),
        ({"prompt_tokens": {"$gte": None}}, "rules[0].when.prompt_tokens.$gte: expected a number, got null"),
        ({"prompt_tokens": {"$lt": float("nan")}}, "rules[0].when.prompt_tokens.$lt: expected a number"),
        ({"protocol": {"$in": "openai"}}, "rules[0].when.protocol.$in: expected a list, got str"),
        (
            {"protocol": {"$in": ["a", ["b"]]}},
            "rules[0].when.protocol.$in[1]: a list is not a value to compare with",
        ),
        (
            {"protocol": {"$in": [{"a": 1}]}},
            "rules[0].when.protocol.$in[0]: expected a string, number, boolean or null, got a mapping",
        ),
        ({"protocol": ["openai", "anthropic"]}, "rules[0].when.protocol: a list is not a value"),
        ({"protocol": {"$eq": ["a"]}}, "rules[0].when.protocol.$eq: a list is not a value"),
        ({"ratio": float("nan")}, "rules[0].when.ratio: NaN equals nothing"),
        ({"x": {"$regex": 5}}, "rules[0].when.x.$regex: expected a regular expression string, got int"),
        (
            {"x": {"$regex": "a" * 513}},
            "rules[0].when.x.$regex: regular expression longer than 512 characters",
        ),
        ({"x": {"$regex": "(unclosed"}}, "rules[0].when.x.$regex: invalid regular expression: missing )"),
        ({"$and": []}, "rules[0].when.$and: expected a non-empty list of conditions, got a list"),
        ({"$or": {"a": 1}}, "rules[0].when.$or: expected a non-empty list of conditions, got a mapping"),
        ({"$or": [{"a": 1}, "b"]}, "rules[0].when.$or[1]: expected a condition (a mapping), got str"),
        ({"$not": ["a"]}, "rules[0].when.$not: expected a condition (a mapping), got a list"),
        ({"$not": {}}, "rules[0].when.$not: empty condition"),
        ({}, "rules[0].when: empty condition"),
        (None, "rules[0].when: expected a condition (a mapping), got null"),
        ("tools", "rules[0].when: expected a condition (a mapping), got str"),
        ({"x": {}}, "rules[0].when.x: no operators given"),
        ({"x": {"$gt": 1, "lt": 5}}, "rules[0].when.x.lt: expected an operator ($eq, $in, $gt"),
        # The $ forgotten: it was "got 'gt'" alone.
        (
            {"x": {"gt": 5}},
            "rules[0].when.x.gt: expected an operator ($eq, $in, $gt, $gte, $lt, $lte, $regex), "
            "got 'gt' (did you mean '$gt'?)",
        ),
        ({"x": {"$exists": True}}, "rules[0].when.x.$exists: unknown operator $exists (fields take $eq"),
        ({"x": {"$not": {"$eq": 1}}}, "rules[0].when.x.$not: $not combines whole conditions"),
        ({"$gt": 5}, "rules[0].when.$gt: $gt applies to a field"),
        ({"$nor": [{"a": 1}]}, "rules[0].when.$nor: unknown operator $nor"),
        ({5: "x"}, "rules[0].when: field names must be strings, got 5"),
        ({"": 1}, "rules[0].when['']: invalid field name"),
        ({"a..b": 1}, "rules[0].when.a..b: invalid field name"),
        ({"1abc": 1}, "rules[0].when.1abc: invalid field name"),
        ({"headers.": 1}, "rules[0].when.headers.: invalid field name"),
        ({"headers.a b": 1}, "rules[0].when['headers.a b']: invalid field name"),
    ],
)
def test_load_time_errors(raw: Any, message: str) -> None:
    assert error_of(raw).startswith(f"policies/default.yaml: {message}")


def test_brief_example_message() -> None:
    assert error_of({"prompt_tokens": {"$gt": "big"}}) == (
        "policies/default.yaml: rules[0].when.prompt_tokens.$gt: expected a number, got str"
    )


def test_deep_error_paths() -> None:
    raw = {"$or": [{"a": 1}, {"$and": [{"b": 1}, {"$not": {"c": {"$in": 3}}}]}]}
    assert (
        error_of(raw)
        == "policies/default.yaml: rules[0].when.$or[1].$and[1].$not.c.$in: expected a list, got int"
    )


def test_where_without_a_path() -> None:
    assert error_of({"x": {"$gt": "1"}}, where="policies/x.yaml") == (
        "policies/x.yaml: x.$gt: expected a number, got str"
    )
    assert error_of({}, where="policies/x.yaml") == "policies/x.yaml: empty condition"
    assert error_of({"$or": 1}, where="f.yaml: when").startswith("f.yaml: when.$or:")


@pytest.mark.parametrize(
    "raw",
    [
        {"__import__": "os"},
        {"__class__": {"$eq": 1}},
        {"_private": 1},
        {"metadata.__dict__": 1},
        {"$where": "this.prompt_tokens > 5"},
        {"$function": {"body": "return true", "args": [], "lang": "js"}},
        {"$expr": {"$gt": ["$a", "$b"]}},
        {"x": {"$where": "1"}},
        {"x": {"$function": "f"}},
        {"x": {"$expr": 1}},
        {"eval('1')": 1},
    ],
)
def test_code_like_conditions_are_rejected(raw: dict[str, Any]) -> None:
    message = error_of(raw)
    assert message.startswith("policies/default.yaml: rules[0].when")
    assert "unknown operator" in message or "invalid field name" in message


def nested_nots(levels: int) -> dict[str, Any]:
    raw: dict[str, Any] = {"a": 1}
    for _ in range(levels):
        raw = {"$not": raw}
    return raw


def test_nesting_limit() -> None:
    # MAX_DEPTH condition mappings may nest; one more is rejected.
    assert cond(nested_nots(MAX_DEPTH - 1)).matches({"a": 1}) is ((MAX_DEPTH - 1) % 2 == 0)
    message = error_of(nested_nots(MAX_DEPTH))
    assert message.endswith(f"conditions nested deeper than {MAX_DEPTH} levels")
    assert message.startswith("policies/default.yaml: rules[0].when.$not.$not")
    deep_list: dict[str, Any] = {"a": 1}
    for _ in range(MAX_DEPTH):
        deep_list = {"$and": [deep_list]}
    assert "nested deeper" in error_of(deep_list)


# --- property-style checks against an independent reference ----------------------------------

SCALARS: list[Any] = [None, True, False, 0, 1, 1.0, 2, -3.5, "", "a", "1", "True", "abc"]
FIELDS = ["f", "g", "m.k", "headers.x-h"]


def lookup(features: dict[str, Any], name: str) -> tuple[bool, Any]:
    keys = ["headers", name.split(".", 1)[1]] if name.startswith("headers.") else name.split(".")
    value: Any = features
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def same(a: Any, b: Any) -> bool:
    kinds = (type(a) is bool, type(b) is bool, isinstance(a, str), isinstance(b, str), a is None, b is None)
    if kinds[0] or kinds[1] or kinds[4] or kinds[5]:
        return a is b
    if kinds[2] or kinds[3]:
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


def reference(raw: dict[str, Any], features: dict[str, Any]) -> bool:
    """A deliberately naive evaluator to compare the compiled closures against."""
    for key, spec in raw.items():
        if key == "$and":
            ok = all(reference(c, features) for c in spec)
        elif key == "$or":
            ok = any(reference(c, features) for c in spec)
        elif key == "$not":
            ok = not reference(spec, features)
        else:
            found, value = lookup(features, key)
            ops = spec if isinstance(spec, dict) else {"$eq": spec}
            ok = found
            for op, arg in ops.items():
                if not ok:
                    break
                numeric = isinstance(value, int | float) and not isinstance(value, bool)
                if op == "$eq":
                    ok = same(value, arg)
                elif op == "$in":
                    ok = any(same(value, x) for x in arg)
                elif op == "$gt":
                    ok = numeric and value > arg
                elif op == "$gte":
                    ok = numeric and value >= arg
                elif op == "$lt":
                    ok = numeric and value < arg
                elif op == "$lte":
                    ok = numeric and value <= arg
                elif op == "$regex":
                    ok = not isinstance(value, dict | list) and re.search(arg, str(value)) is not None
        if not ok:
            return False
    return True


def random_condition(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        op = rng.choice(["$and", "$or"])
        return {op: [random_condition(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if depth < 3 and roll < 0.35:
        return {"$not": random_condition(rng, depth + 1)}
    out: dict[str, Any] = {}
    for name in rng.sample(FIELDS, rng.randint(1, 2)):
        kind = rng.random()
        if kind < 0.3:
            out[name] = rng.choice(SCALARS)
            continue
        ops: dict[str, Any] = {}
        for op in rng.sample(["$eq", "$in", "$gt", "$gte", "$lt", "$lte", "$regex"], rng.randint(1, 2)):
            if op == "$eq":
                ops[op] = rng.choice(SCALARS)
            elif op == "$in":
                ops[op] = rng.sample(SCALARS, rng.randint(0, 4))
            elif op == "$regex":
                ops[op] = rng.choice(["^a", "1", "True", "^$", "b|c", "(?i)ABC"])
            else:
                ops[op] = rng.choice([-1, 0, 1, 1.5, 2])
        out[name] = ops
    return out


def random_value(rng: random.Random) -> Any:
    return rng.choice([*SCALARS, [1], {"k": 1}, float("nan"), 10**20])


def random_features(rng: random.Random) -> dict[str, Any]:
    features: dict[str, Any] = {}
    for name in ("f", "g"):
        if rng.random() < 0.8:
            features[name] = random_value(rng)
    if rng.random() < 0.8:
        features["m"] = {"k": random_value(rng)} if rng.random() < 0.8 else random_value(rng)
    if rng.random() < 0.8:
        features["headers"] = {"x-h": rng.choice(["a", "abc", "x"])}
    return features


def test_compiled_conditions_agree_with_reference() -> None:
    rng = random.Random(7)
    checked = matched = 0
    for _ in range(400):
        raw = random_condition(rng)
        condition = cond(raw)
        for _ in range(10):
            features = random_features(rng)
            result = condition.matches(features)
            assert result is reference(raw, features), (raw, features)
            checked += 1
            matched += result
    # The generator must exercise both outcomes, or agreement would prove little.
    assert checked == 4000
    assert 300 < matched < 3700


def test_random_garbage_compiles_or_raises_config_error() -> None:
    rng = random.Random(99)
    pieces: list[Any] = [*SCALARS, [], {}, ["x"], [{}], {"$gt": "x"}, {"$in": 1}, {"$regex": "("}]
    keys = ["f", "$and", "$or", "$not", "$gt", "$in", "$regex", "$eq", "$bad", "__x", "a.b", ""]
    compiled = rejected = 0
    for _ in range(2000):
        raw: Any = {rng.choice(keys): rng.choice(pieces) for _ in range(rng.randint(0, 3))}
        if rng.random() < 0.3:
            raw = {rng.choice(keys): raw}
        try:
            condition = cond(raw)
        except ConfigError as exc:
            assert str(exc).startswith(WHERE)
            rejected += 1
            continue
        compiled += 1
        for _ in range(3):
            assert isinstance(condition.matches(random_features(rng)), bool)
    assert compiled > 20 and rejected > 1000
