"""Property-based fuzzing of a real router (uvicorn, the fake provider) with mutated valid requests.

Each example takes a valid body of one endpoint, mutates it (one field path given a wrong type, a
null, a huge or negative number, NaN, a deep nesting, an empty or oversized string, an unknown role
or block type, broken tool arguments; or the raw bytes made invalid UTF-8, cut short, not JSON;
or an odd Content-Type, x-router-* header or Authorization) and sends it. The house rule is
asserted on every answer: a 4xx (or a 2xx when the request is acceptable after all), never a 5xx
of the router's own making; the protocol's own error shape with a message; no traceback text; a
valid request still served afterwards; and a row in the log for every proxied request answered.

Bounded for a 2-core CI machine: derandomized, no example database, a fixed number of examples.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import (
    ANTHROPIC_PATHS,
    RunningRouter,
    assert_protocol_shaped,
    local_policy,
    serving,
)

pytestmark = pytest.mark.integration

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
COUNT, ROUTE, OUTCOMES = "/v1/messages/count_tokens", "/v1/route", "/v1/outcomes"
PROXIED = (CHAT, MESSAGES, RESPONSES)

_TOOL_FN = {
    "type": "function",
    "function": {"name": "run", "parameters": {"type": "object", "properties": {}}},
}
VALID: dict[str, list[dict[str, Any]]] = {
    CHAT: [
        {"model": "auto", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "max_tokens": 50, "temperature": 0.5},
        {"model": "auto", "stream": True, "stream_options": {"include_usage": True},
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"model": "auto", "tools": [_TOOL_FN], "messages": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]},
    ],
    RESPONSES: [
        {"model": "auto", "input": "hi", "instructions": "be brief", "max_output_tokens": 50},
        {"model": "auto", "stream": True, "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
        {"model": "auto", "tools": [{"type": "function", "name": "run", "parameters": {"type": "object"}}], "input": [
            {"role": "user", "content": "run it"},
            {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{\"a\": 1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ]},
    ],
    MESSAGES: [
        {"model": "claude-x", "max_tokens": 50, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]},
        {"model": "claude-x", "max_tokens": 50, "stream": True,
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"model": "claude-x", "max_tokens": 50,
         "tools": [{"name": "run", "input_schema": {"type": "object", "properties": {}}}],
         "messages": [
             {"role": "user", "content": "run it"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {"a": 1}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
         ]},
    ],
    COUNT: [{"model": "claude-x", "messages": [{"role": "user", "content": "hi"}], "system": "be brief"}],
    ROUTE: [{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}],
    OUTCOMES: [{"task_id": "t-fuzz", "success": False, "score": 0.5}],
}  # fmt: skip
# The same bodies sent to a backend of the other protocol family: through litellm's translation.
for _path, _other in ((CHAT, "local-claude"), (RESPONSES, "local-claude"), (MESSAGES, "local-large")):
    VALID[_path] += [{**b, "model": _other} for b in VALID[_path]]
OK_CHAT = VALID[CHAT][0]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field path of a JSON value: object keys and array indices, the root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(copy[path[0]], path[1:], new)
    return copy


def nested(depth: int) -> Any:
    out: Any = "x"
    for i in range(depth):
        out = [out] if i % 2 else {"a": out}
    return out


class Raw:
    """A JSON literal the encoders cannot write (NaN, Infinity, a lone surrogate), spliced in as text."""

    def __init__(self, text: str) -> None:
        self.text = text


ODD_VALUES = st.sampled_from(
    [None, True, False, 0, -1, -(2**63), 2**64, 10**400, 1.5, -1e308, "", "x" * 200_000, [], {}, [None], {"": None},
     "wizard", {"type": "bogus"}, [{"type": "bogus"}], "{not json", "\x00", "\ud800", nested(300), nested(900),
     Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999999"), Raw('"\\ud800"'), Raw("[" * 5000 + "]" * 5000)]
) | st.integers() | st.floats() | st.text(max_size=20)  # fmt: skip


def encode(value: Any) -> bytes:
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), allow_nan=True)  # NaN/Infinity floats: the literals, as JS writes them
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mutated_body(draw: st.DrawFn, endpoint: str) -> tuple[bytes, dict[str, Any]]:
    """A valid body of ``endpoint`` with one mutation; the bytes, and the body before encoding."""
    body = draw(st.sampled_from(VALID[endpoint]))
    kind = draw(st.sampled_from(["field", "field", "field", "add", "stream", "raw"]))
    if kind == "field":
        path = draw(st.sampled_from(list(paths(body))))
        body = replaced(body, path, draw(ODD_VALUES))
        note(f"field {path}")
    elif kind == "add":
        containers = [p for p in paths(body) if isinstance(_at(body, p), dict)]
        path = draw(st.sampled_from([(), *containers]))
        key = draw(st.sampled_from(["role", "type", "arguments", "input", "cache_control", "x", ""]))
        body = replaced(body, path, {**_at(body, path), key: draw(ODD_VALUES)})
        note(f"add {key!r} at {path}")
    elif kind == "stream":
        body = {**body, "stream": draw(st.sampled_from([True, False, None, "yes", 1, {}]))}
    raw = encode(body)
    if kind == "raw":
        how = draw(st.sampled_from(["utf8", "cut", "empty", "bom", "garbage", "trailing", "array", "latin1"]))
        note(f"raw {how}")
        cut = draw(st.integers(min_value=1, max_value=len(raw) - 1))
        raw = {
            "utf8": raw.replace(b'"hi"', b'"h\xff\xfei"').replace(b"brief", b"bri\xc3\x28f"),
            "cut": raw[:cut],
            "empty": b"",
            "bom": b"\xef\xbb\xbf" + raw,
            "garbage": draw(st.binary(max_size=64)),
            "trailing": raw + b" {}",
            "array": b"[" + raw + b"]",
            "latin1": raw.decode().replace("hi", "h\u00e9\u00ff").encode("latin-1", "replace"),
        }[how]
    return raw, body


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        value = value[k]
    return value


HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "content-type": st.sampled_from(
            ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "",
             "application/json; charset=latin-1", "application/json; charset=utf-16"]
        ),
        "authorization": st.sampled_from(
            ["", "Bearer", "Bearer  x", "Basic Zm9vOmJhcg==", "bearer sk-x", "Bearer " + "k" * 10_000, "Bearer a b",
             "Bearer \u00e9t\u00e9"]
        ),
        "x-api-key": st.sampled_from(["", "x y", "sk-ant-nope"]),
        "x-router-task-id": st.sampled_from(["", "a b", "t" * 5000, "a/../b", "\u00e9", "\x80\xff"]),
        "x-router-attempt": st.sampled_from(["", "0", "-1", "1e9", "NaN", "99999999999999999999", "1.5", "two"]),
        "x-router-repo": st.sampled_from(["", "r" * 5000, "\u00e9"]),
        "x-router-tier": st.sampled_from(["", "gold", "\u00e9"]),
        "x-router-team": st.sampled_from(["", "t" * 5000]),
        "anthropic-version": st.sampled_from(["", "1999-01-01", "garbage"]),
        "content-encoding": st.sampled_from(["gzip", "br", "identity"]),
    },
)  # fmt: skip


def check(r: httpx.Response, endpoint: str) -> None:
    assert_protocol_shaped(r.status_code, r.text, endpoint)


@pytest.fixture(scope="module")
def served(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRouter]:
    with serving(local_policy(upstream.url), tmp_path_factory.mktemp("fuzz_http")) as r:
        yield r


ENDPOINTS = [CHAT, RESPONSES, MESSAGES, COUNT, ROUTE, OUTCOMES]
FUZZ = settings(
    max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_mutated_requests_get_protocol_shaped_refusals(served: RunningRouter, endpoint: str) -> None:
    proxied = 0
    with httpx.Client(base_url=served.url, timeout=30) as c:
        before = len(served.records(0))

        @FUZZ
        @given(case=mutated_body(endpoint), headers=HEADERS)
        def run(case: tuple[bytes, dict[str, Any]], headers: dict[str, str]) -> None:
            nonlocal proxied
            raw, _ = case
            h = {"content-type": "application/json", **headers}
            if endpoint in ANTHROPIC_PATHS:
                h.setdefault("anthropic-version", "2023-06-01")
            # As bytes: a client may send any octets in a header value, UTF-8 ones included.
            r = c.post(endpoint, content=raw, headers={k: v.encode() for k, v in h.items()})
            check(r, endpoint)
            proxied += endpoint in PROXIED
            # The server keeps serving.
            ok = c.post(CHAT, json=OK_CHAT)
            assert ok.status_code == 200, ok.text
            proxied += 1

        started = time.monotonic()
        run()
        assert time.monotonic() - started < 60
    # Nothing is lost: every proxied request, refused or served, has its row in the log.
    assert len(served.records(before + proxied, timeout=10)) >= before + proxied


POLICY_TEXTS = st.sampled_from(
    [b"", b"[" * 5000 + b"]" * 5000, b"a: " + b"{a: " * 400 + b"1" + b"}" * 400, bytes(range(256)),
     "name: caf\u00e9\n".encode("latin-1"), b"- 1\n- 2\n", b"42", b"models: [a\n  b: : c", b"nonsense: 1\n",
     b"a: &a [1]\nb: *a\n" * 50, b"\xef\xbb\xbfversion: 1\n", b"version: .nan\nmodels: .inf\n"]
) | st.binary(max_size=200)  # fmt: skip
SINCE = st.sampled_from(["7d", "", "x", "-1d", "99999999999999999999w", "1e999d", "nan", "0s", "1.5h"])


@settings(
    max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(text=POLICY_TEXTS, since=SINCE)
def test_posted_policies_get_openai_shaped_refusals(served: RunningRouter, text: bytes, since: str) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as c:
        r = c.post("/v1/policy/preview", params={"since": since}, content=text)
        check(r, "/v1/policy/preview")
        assert c.get("/readyz").status_code == 200


# Found by the fuzzing above, pinned: a text/plain "Internal Server Error", a 500 no SDK reads (PyYAML
# composes recursively, and its RecursionError escaped).
def test_a_posted_policy_nested_too_deeply_is_a_400(served: RunningRouter) -> None:
    text = b"[" * 5000 + b"]" * 5000
    r = httpx.post(served.url + "/v1/policy/preview", content=text, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "policy.yaml (posted): the document is nested too deeply"


MASTER = "fuzz-master-key"


@pytest.fixture(scope="module")
def locked(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRouter]:
    """A router with a master key: the keyed endpoints check every Authorization form."""
    with serving(local_policy(upstream.url), tmp_path_factory.mktemp("fuzz_locked"), master_key=MASTER) as r:
        yield r


ODD_SEGMENTS = st.sampled_from(
    ["", "x", "%00", "%ff%fe", "..%2F..%2Fetc", "a" * 5000, "%E2%80%AE", "t-1?x=1", "%25", "%20", "k:1/2", "\u00e9"]
)  # fmt: skip
ODD_QUERY = st.dictionaries(
    st.sampled_from(["window", "since", "protocol", "attempt", "limit", "task", "x"]),
    st.sampled_from(
        ["", "7d", "-1", "99999999999999999999w", "nan", "x" * 3000, "\u00e9", "openai_chat", "%00"]
    ),
    max_size=3,
)
AUTH = st.sampled_from(
    [None, "", "Bearer " + MASTER, "bearer " + MASTER, "Bearer " + MASTER + "x", "Basic Zm9vOmJhcg==", "Bearer",
     "Bearer sk-" + "k" * 5000, "Bearer \u00e9t\u00e9", "Token " + MASTER]
)  # fmt: skip
SURFACES = st.sampled_from(
    [("GET", "/v1/models/{}"), ("GET", "/v1/tasks/{}"), ("GET", "/v1/tasks"), ("GET", "/v1/policy"),
     ("POST", "/v1/route"), ("POST", "/v1/outcomes"), ("POST", "/v1/policy/preview"), ("GET", "/ui"),
     ("GET", "/ui/tasks/{}"), ("GET", "/ui/tasks"), ("GET", "/ui/latency"), ("GET", "/ui/policy"),
     ("POST", "/ui/policy/preview"), ("POST", "/ui/login"), ("POST", "/ui/logout"), ("GET", "/readyz"),
     ("GET", "/metrics"), ("DELETE", "/v1/chat/completions"), ("GET", "/v1/messages"), ("PUT", "/v1/{}"),
     ("POST", "/v1/messages/count_tokens"), ("POST", "/v1/chat/completions"), ("POST", "/v1/responses")]
)  # fmt: skip


@settings(
    max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    surface=SURFACES, segment=ODD_SEGMENTS, query=ODD_QUERY, auth=AUTH,
    body=st.sampled_from([b"", b"{}", b"password=" + MASTER.encode(), b"password=%ff", b"\xff\xfe", encode(OK_CHAT)]),
    form=st.booleans(),
)  # fmt: skip
def test_every_surface_refuses_odd_paths_queries_and_keys(
    locked: RunningRouter, surface: tuple[str, str], segment: str, query: dict[str, str], auth: str | None,
    body: bytes, form: bool,
) -> None:  # fmt: skip
    method, template = surface
    path = template.format(segment)
    headers = {"content-type": "application/x-www-form-urlencoded" if form else "application/json"}
    if auth is not None:
        headers["authorization"] = auth
    with httpx.Client(base_url=locked.url, timeout=30) as c:
        r = c.request(
            method, path, params=query, content=body, headers={k: v.encode() for k, v in headers.items()}
        )
        assert "Traceback" not in r.text and 'File "' not in r.text, r.text[:2000]
        assert r.status_code < 500, (r.status_code, r.text[:2000])
        if r.status_code >= 400 and not path.startswith("/ui") and path not in ("/metrics", "/readyz"):
            check(r, MESSAGES if "/messages" in path else path)
        ok = c.post(CHAT, json=OK_CHAT, headers={"authorization": "Bearer " + MASTER})
        assert ok.status_code == 200, ok.text


# Found by the fuzzing above, pinned: a role or type of a list or an object was looked up in a set, a
# TypeError answered 500 "internal error in the router"; now the role is refused as any unknown one
# is, and a message's type (which no chat or Messages parser reads) is no lookup's business.
@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (CHAT, {"model": "auto", "messages": [{"role": ["user"], "content": "hi"}]}, 400),
        (CHAT, {"model": "auto", "messages": [{"role": "user", "content": "hi", "type": ["x"]}]}, 200),
        (RESPONSES, {"model": "auto", "input": [{"role": {"a": 1}, "content": "hi"}]}, 400),
        (RESPONSES, {"model": "auto", "input": [{"type": ["message"], "role": "user", "content": "hi"}]}, 400),
        (MESSAGES, {"model": "claude-x", "max_tokens": 9, "messages": [{"role": ["user"], "content": "hi"}]}, 400),
        (MESSAGES, {"model": "claude-x", "max_tokens": 9, "messages": [{"role": "user", "content": "hi", "type": {}}]},
         200),
    ],
)  # fmt: skip
def test_a_role_or_type_of_a_list_or_object(
    served: RunningRouter, path: str, body: dict[str, Any], status: int
) -> None:
    r = httpx.post(served.url + path, json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == status, r.text
    if status == 400:
        check(r, path)
        assert "role" in r.text or "type" in r.text


@pytest.mark.parametrize("model", ["auto", "local-claude"])
def test_a_responses_tool_type_that_is_no_string_is_a_400(served: RunningRouter, model: str) -> None:
    # Found by the fuzzing above, pinned: a tool's type of a number reached litellm's translation
    # (to a backend of another family), a TypeError on every backend tried, a 502.
    body = {
        "model": model,
        "input": "hi",
        "tools": [{"type": 5, "name": "run", "parameters": {"type": "object"}}],
    }
    r = httpx.post(served.url + RESPONSES, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "tools[0].type: must be a string naming the tool's type"


_CALL = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("messages", "tools", "says"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": 5}], None,
         "messages.1.tool_calls: must be a list of tool calls"),
        ([{"role": "user", "content": None}], None, "messages.0.content: required for a user message"),
        ([{"role": "user", "content": "hi"}], [{"type": "", "function": {"name": "run"}}], "tools.0.type"),
    ],
)  # fmt: skip
def test_chat_shapes_translation_failed_on_are_400s(
    served: RunningRouter, messages: list[Any], tools: list[Any] | None, says: str
) -> None:
    # Found by the fuzzing above (bodies sent to a backend of the other family), pinned: a tool_calls
    # of a number and a tool type of "" failed in litellm's translation, a 502 "translation for backend
    # 'local-claude' (anthropic) failed"; so did a user message of no content beside tool calls (alone,
    # it was served: OpenAI refuses one).
    body = {"model": "local-claude", "messages": messages, **({"tools": tools} if tools else {})}
    r = httpx.post(served.url + CHAT, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_nameless_tool_use_is_a_400(served: RunningRouter) -> None:
    # Found by the fuzzing above, pinned: sent to an OpenAI backend, litellm's translation failed on
    # it (a TypeError), a 502 "translation for backend 'local-mini' (openai) failed".
    call = {"type": "tool_use", "id": "t1", "name": None, "input": {}}
    messages = [{"role": "user", "content": "run"}, {"role": "assistant", "content": [call]}]
    body = {"model": "local-large", "max_tokens": 9, "messages": messages}
    r = httpx.post(served.url + MESSAGES, json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == 400, r.text
    check(r, MESSAGES)
    assert "messages.1.content.0" in r.json()["error"]["message"]


@pytest.mark.parametrize("empty", ["", []])
def test_an_empty_anthropic_message_is_a_400(served: RunningRouter, empty: Any) -> None:
    # Found by the fuzzing above, pinned: sent to an OpenAI backend, litellm's translation failed on
    # it (a ValueError), a 502 "translation for backend 'local-mini' (openai) failed".
    body = {"model": "local-large", "max_tokens": 9, "messages": [{"role": "user", "content": empty}]}
    r = httpx.post(served.url + MESSAGES, json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30)
    assert r.status_code == 400, r.text
    check(r, MESSAGES)
    assert "messages.0.content: all messages must have non-empty content" in r.json()["error"]["message"]


_BROKEN = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{not json"}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body", "says", "param"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "bogus", "function": {"name": "run"}}]},
         "tools.0.type: a tool of type 'bogus'", "tools"),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [_BROKEN]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
         "messages.1.tool_calls.0.function.arguments: arguments that are not JSON text", "messages"),
        (RESPONSES, {"input": [{"role": "user", "content": "run"},
                               {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{not json"},
                               {"type": "function_call_output", "call_id": "c1", "output": "ok"}]},
         "input.1.arguments: function call arguments that are not JSON text", "input"),
        (RESPONSES, {"input": "hi", "tools": [{"type": "bogus", "name": "run"}]}, "tools.0.type: a tool of type 'bogus'",
         "tools"),
    ],
)  # fmt: skip
def test_a_request_no_candidate_can_translate_is_a_400_naming_the_field(
    served: RunningRouter, path: str, body: dict[str, Any], says: str, param: str, stream: bool
) -> None:
    # Found by the fuzzing above (bodies sent to a backend of the other family), pinned: litellm's
    # translation for local-claude failed on each, a 502 'translation for backend ... failed' or,
    # for the arguments, '... sent a reply or stream event that is not JSON' (retried, and counted
    # against the backend's breaker). Asked of "auto", a relayed candidate serves the same request.
    r = httpx.post(served.url + path, json={**body, "model": "local-claude", "stream": stream}, timeout=30)
    assert r.status_code == 400, r.text
    check(r, path)
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert (
        err["message"]
        == f"invalid request: {says} cannot be translated for backend 'local-claude' (anthropic)"
    )
    served_anyway = httpx.post(
        served.url + path, json={**body, "model": "auto", "stream": stream}, timeout=30
    )
    assert served_anyway.status_code == 200, served_anyway.text
    assert served_anyway.headers["x-router-model"] != "local-claude"
