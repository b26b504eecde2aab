"""Property-based fuzzing (hypothesis): request parsing, rule conditions and token estimation never crash.

Bounded for a noisy 2-core machine: a fixed number of examples per property and no per-example
deadline. Derandomized, with the example database off, so every run tries the same examples.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from router.errors import ConfigError, RouterError
from router.features.tokens import TokenCounter
from router.policy.config import RULE_FIELDS
from router.policy.pipeline import request_features
from router.policy.rules import compile_condition
from router.protocols import WIRES, ClientRequest
from router.protocols import anthropic as anthropic_protocol

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- JSON-ish values --------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=40,
)

ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "wizard", ""])
MODELS = st.sampled_from(["auto", "claude-x", "local-large", "", "x" * 300]) | st.text(max_size=20)
content_parts = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "text",
                "image_url",
                "image",
                "tool_use",
                "tool_result",
                "input_text",
                "function_call",
                "reasoning",
                "thinking",
                "weird",
            ]
        )
    },
    optional={
        "text": json_values,
        "content": json_values,
        "input": json_values,
        "image_url": json_values,
        "source": json_values,
        "arguments": json_values,
        "name": json_values,
    },
)
contents = st.text(max_size=200) | st.lists(content_parts | json_values, max_size=4) | json_values
messages = st.lists(
    st.fixed_dictionaries({"role": ROLES, "content": contents}, optional={"tool_calls": json_values}),
    max_size=4,
)
tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "mcp", "custom", "web_search"])},
        optional={
            "function": json_values
            | st.fixed_dictionaries({"name": st.text(max_size=10), "parameters": json_values}),
            "name": json_values,
            "parameters": json_values,
            "input_schema": json_values,
            "server_url": st.just("http://127.0.0.1:9/"),
        },
    ),
    max_size=3,
)
NUMBERS = (
    st.integers(min_value=-5, max_value=2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.booleans()
)
request_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": MODELS | json_values,
        "messages": messages | json_values,
        "input": st.text(max_size=50) | messages | json_values,
        "system": contents,
        "instructions": json_values,
        "tools": tools | json_values,
        "max_tokens": NUMBERS,
        "max_completion_tokens": NUMBERS,
        "max_output_tokens": NUMBERS,
        "temperature": NUMBERS,
        "top_p": NUMBERS,
        "stream": st.booleans() | json_values,
        "stream_options": json_values,
        "thinking": json_values
        | st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled", "x"]), "budget_tokens": NUMBERS}
        ),
        "reasoning": json_values,
        "metadata": json_values,
        "previous_response_id": json_values,
        "prompt_cache_key": json_values,
        "n": NUMBERS,
    },
)

schemas = st.recursive(
    st.fixed_dictionaries(
        {}, optional={"type": st.sampled_from(["object", "string", "integer", "array", "wat"]) | json_values}
    ),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={
            "properties": st.dictionaries(st.text(max_size=8), inner | json_values, max_size=3),
            "items": inner | st.lists(inner, max_size=2) | json_values,
            "required": st.lists(st.text(max_size=5), max_size=2) | json_values,
            "anyOf": st.lists(inner, max_size=2) | json_values,
            "additionalProperties": inner | st.booleans(),
            "enum": json_values,
        },
    ),
    max_leaves=12,
)
OK_NUMBER = st.integers(min_value=1, max_value=100_000) | NUMBERS
text_parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": st.text(max_size=30)})
    | content_parts,
    min_size=1,
    max_size=3,
)
chat_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["auto", "local-large"]) | MODELS,
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
                    "content": st.text(max_size=80) | text_parts | st.none(),
                },
                optional={"tool_calls": json_values, "name": json_values},
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "tools": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": st.text(min_size=1, max_size=10)}, optional={"parameters": schemas}
                    ),
                }
            ),
            max_size=2,
        ),
        "max_tokens": OK_NUMBER,
        "temperature": st.floats(0, 2) | NUMBERS,
        "stream": st.booleans(),
        "reasoning_effort": st.sampled_from(["low", "high", "none"]) | json_values,
    },
)
anthropic_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["claude-x", "local-claude"]) | MODELS,
        "max_tokens": OK_NUMBER,
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant"]),
                    "content": st.text(min_size=1, max_size=80) | text_parts,
                }
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "system": st.text(max_size=40) | text_parts,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(min_size=1, max_size=10)}, optional={"input_schema": schemas}
            ),
            max_size=2,
        ),
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled", "adaptive"])},
            optional={"budget_tokens": OK_NUMBER},
        ),
        "metadata": st.fixed_dictionaries({"user_id": st.text(max_size=60) | json_values}),
        "stream": st.booleans(),
    },
)
responses_bodies = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["auto", "local-large"]) | MODELS,
        "input": st.text(min_size=1, max_size=80)
        | st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant", "developer"]),
                    "content": st.text(max_size=40) | text_parts,
                }
            )
            | st.fixed_dictionaries(
                {"type": st.sampled_from(["function_call", "function_call_output", "reasoning"])},
                optional={"output": json_values, "arguments": json_values, "summary": json_values},
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "instructions": st.text(max_size=40),
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "mcp", "web_search", "custom"])},
                optional={"name": st.text(min_size=1, max_size=10), "parameters": schemas},
            ),
            max_size=2,
        ),
        "max_output_tokens": OK_NUMBER,
        "reasoning": st.fixed_dictionaries(
            {}, optional={"effort": st.sampled_from(["low", "high"]) | json_values}
        ),
        "prompt_cache_key": st.text(max_size=20) | json_values,
        "stream": st.booleans(),
    },
)
PROTOCOL_BODIES = {
    "openai_chat": chat_bodies,
    "anthropic": anthropic_bodies,
    "openai_responses": responses_bodies,
}


def encode(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits: orjson refuses them, the stdlib does not
        import json

        return json.dumps(value).encode()


COUNTER = TokenCounter(max_entries=1000)


def check_parse(protocol: str, raw: bytes) -> None:
    try:
        req = WIRES[protocol].parse(raw)
    except RouterError:
        return
    event("parsed")
    assert isinstance(req, ClientRequest) and req.protocol == protocol
    # Whatever parses must also survive everything the router computes from it before routing.
    feats = request_features(req, COUNTER.count_request(req), {})
    assert feats.prompt_tokens >= 0
    req.tools_sha256()
    req.system_sha256()
    orjson.dumps(req.body)


@pytest.mark.parametrize("protocol", list(WIRES))
@FUZZ
@given(data=st.data())
def test_parse_protocol_shaped_bodies(protocol: str, data: st.DataObject) -> None:
    check_parse(protocol, encode(data.draw(PROTOCOL_BODIES[protocol])))


@pytest.mark.parametrize("protocol", list(WIRES))
@FUZZ
@given(body=request_bodies)
def test_parse_structured_bodies(protocol: str, body: dict[str, Any]) -> None:
    check_parse(protocol, encode(body))


@pytest.mark.parametrize("protocol", list(WIRES))
@FUZZ
@given(value=json_values)
def test_parse_any_json(protocol: str, value: Any) -> None:
    check_parse(protocol, encode(value))


@pytest.mark.parametrize("protocol", list(WIRES))
@FUZZ
@given(raw=st.binary(max_size=300))
def test_parse_any_bytes(protocol: str, raw: bytes) -> None:
    check_parse(protocol, raw)


@FUZZ
@given(body=anthropic_bodies | request_bodies)
def test_count_tokens_parse(body: dict[str, Any]) -> None:
    try:
        req = anthropic_protocol.parse(encode(body), count_only=True)
    except RouterError:
        return
    assert COUNTER.count_anthropic(req.system, req.messages, req.tools or None) >= 0


# --- rules ------------------------------------------------------------------------------------

FIELDS = st.sampled_from([*sorted(RULE_FIELDS), "headers.x-team", "headers.x-router-tier", "nested.value"])
OPERANDS = scalars | st.lists(scalars, max_size=3)
field_specs = OPERANDS | st.dictionaries(
    st.sampled_from(["$eq", "$in", "$gt", "$gte", "$lt", "$lte", "$regex", "$nope", "$and"]),
    OPERANDS | st.sampled_from(["^a", "(unclosed", "a{1,3}", ".*"]),
    max_size=3,
)
conditions = st.recursive(
    st.dictionaries(FIELDS, field_specs, min_size=1, max_size=3),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"$and": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda xs: {"$or": xs}, st.lists(inner, max_size=3)),
        st.builds(lambda x: {"$not": x}, inner),
    ),
    max_leaves=10,
)
feature_maps = st.dictionaries(
    FIELDS.map(lambda f: f.split(".")[0]),
    json_values
    | st.dictionaries(st.sampled_from(["x-team", "x-router-tier", "value"]), json_values, max_size=2),
    max_size=8,
)


@FUZZ
@given(raw=conditions | json_values, feats=feature_maps)
def test_rules_compile_or_refuse_and_never_raise_when_matching(raw: Any, feats: dict[str, Any]) -> None:
    try:
        cond = compile_condition(raw, where="fuzz.yaml: rules[0].when")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.yaml: rules[0].when")
        return
    event("compiled")
    assert cond.matches(feats) in (True, False)
    assert cond.matches({}) in (True, False)


# --- token estimation -------------------------------------------------------------------------

texts = st.text(max_size=400) | st.text(alphabet=st.sampled_from(" \n\tab1.é😀<|endoftext|>"), max_size=400)


@FUZZ
@given(a=texts, b=texts)
def test_token_counts_are_sane(a: str, b: str) -> None:
    n_a, n_b, n_ab = COUNTER.count_text(a), COUNTER.count_text(b), COUNTER.count_text(a + b)
    assert n_a >= 0 and (n_a == 0) == (a == "")
    # A token is at least one byte of text.
    assert n_a <= len(a.encode("utf-8", "surrogatepass"))
    # Joining two texts changes the count only where they meet: BPE re-segments the text around
    # the seam ("quence" + "stop" is 1 + 1 tokens, "quencestop" 4), so the slack is that text's count.
    seam = COUNTER.count_text(a[-32:] + b[:32])
    assert (n_a + n_b) // 2 - 1 <= n_ab <= n_a + n_b + seam


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(chunk=st.text(min_size=1, max_size=50), times=st.integers(min_value=1, max_value=4000))
def test_long_texts_grow_roughly_linearly(chunk: str, times: int) -> None:
    once = COUNTER.count_text(chunk)
    many = COUNTER.count_text(chunk * times)
    # Repetition can only merge across the seams (fewer tokens) or not at all, never explode.
    assert many <= once * times + times
    assert many >= math.ceil(len((chunk * times).encode("utf-8", "surrogatepass")) / 64)


@FUZZ
@given(items=json_values, tools_=json_values)
def test_structured_counts_never_raise(items: Any, tools_: Any) -> None:
    assert COUNTER.count_openai_chat(items, tools_) >= 0
    assert COUNTER.count_anthropic(items, items, tools_) >= 0
    assert COUNTER.count_responses(items, items, tools_) >= 0
