"""Hostile input: nothing a client sends can steer the upstream, crash the router or touch the store.

The SSRF proof runs a second TCP listener on 127.0.0.1 that records every connection, puts its
address in every field that could steer a provider call, sends requests in all three protocols
over both the relay and the litellm-translated paths, and asserts the listener saw nothing.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, assert_protocol_shaped, local_policy, serving

pytestmark = pytest.mark.integration

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
MASTER = "hostile-tests-master-key"


class Listener:
    """A TCP server that accepts, records and closes every connection it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(0.5)
                try:
                    first = conn.recv(200)
                except OSError:
                    first = b""
                self.seen.append(first or b"(connected)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    trap = Listener()
    yield trap
    trap.close()


def hostile_policy(upstream_url: str) -> dict[str, Any]:
    policy = local_policy(upstream_url)
    policy["models"].append(
        {"id": "local-resp", "litellm_model": "openai/large-model", "protocol": "openai_responses",
         "api_base": upstream_url + "/v1", "context_window": 400000, "max_output_tokens": 32768,
         "prices": {"input": 1.25, "output": 10.0},
         "capabilities": {"tools": True, "vision": True}}
    )  # fmt: skip
    policy["routes"].append({"match": "local-resp", "passthrough": "local-resp"})
    for model in policy["models"]:
        model["api_key_env"] = "ROUTER_HOSTILE_PROVIDER_KEY"
    return policy


@pytest.fixture(scope="module")
def router(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRouter]:
    """One router for the module: every test here must leave it serving (most check that they do)."""
    os.environ["ROUTER_HOSTILE_PROVIDER_KEY"] = "provider-key-from-the-environment"
    try:
        with serving(
            hostile_policy(upstream.url), tmp_path_factory.mktemp("hostile"), master_key=MASTER
        ) as r:
            yield r
    finally:
        os.environ.pop("ROUTER_HOSTILE_PROVIDER_KEY", None)


def client(router: RunningRouter, timeout: float = 30) -> httpx.Client:
    return httpx.Client(base_url=router.url, timeout=timeout, headers={"x-api-key": MASTER})


# --- SSRF: the client names an address; nothing ever connects to it ---------------------------


def steering(url: str) -> dict[str, Any]:
    """Every field a client might use to choose where, with what key or headers, a call goes."""
    return {
        "api_base": url,
        "base_url": url,
        "api_key": "client-chosen-key",
        "custom_llm_provider": "openai",
        "extra_headers": {"x-forwarded-host": url, "authorization": "Bearer client-chosen-key"},
        "headers": {"authorization": "Bearer client-chosen-key", "host": url},
        "litellm_params": {"api_base": url, "api_key": "client-chosen-key", "model": "openai/x"},
        "mcp_servers": [{"type": "url", "url": url + "/sse", "name": "trap"}],
        "extra_body": {"api_base": url, "base_url": url},
        "extra_query": {"url": url},
        "config": {"api_base": url, "nested": {"base_url": url, "litellm_params": {"api_base": url}}},
        "model_list": [{"model_name": "auto", "litellm_params": {"model": "openai/x", "api_base": url}}],
        "azure_endpoint": url,
        "api_version": "2099-01-01",
        "organization": url,
        "proxy_url": url,
        "webhook_url": url,
        "callback_url": url,
        "success_callback": ["webhook"],
        "langfuse_host": url,
        "user_config": {"model_list": [{"model_name": "auto", "litellm_params": {"api_base": url}}]},
        "aws_bedrock_runtime_endpoint": url,
        "vertex_ai_location": url,
        "timeout": 0.001,
        "num_retries": 50,
    }


STEER_HEADERS = ("x-api-base", "api-base", "x-litellm-api-base", "x-base-url", "x-forwarded-host")


def body_for(path: str, model: str, url: str, stream: bool) -> dict[str, Any]:
    if path == CHAT:
        base: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    elif path == MESSAGES:
        base = {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "hello"}]}
    else:
        base = {"model": model, "input": "hello"}
    return {**steering(url), **base, "stream": stream}


# (client protocol, requested model): relay when the backend speaks the client's protocol,
# litellm translation otherwise.
PATHS = [
    (CHAT, "local-large"),  # relay
    (CHAT, "local-claude"),  # translated to Anthropic
    (MESSAGES, "local-claude"),  # relay
    (MESSAGES, "local-large"),  # translated to Chat Completions
    (RESPONSES, "local-resp"),  # relay
    (RESPONSES, "local-large"),  # translated to Chat Completions
    (RESPONSES, "local-claude"),  # translated to Anthropic
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_steering_fields_never_reach_an_address(
    router: RunningRouter, upstream: FakeUpstream, listener: Listener, stream: bool
) -> None:
    upstream.clear()
    with client(router) as c:
        for path, model in PATHS:
            headers = {h: listener.url for h in STEER_HEADERS}
            r = c.post(path, json=body_for(path, model, listener.url, stream), headers=headers)
            assert r.status_code == 200, (path, model, r.text)
            assert r.headers["x-router-model"] == model
    assert listener.seen == []
    sent = upstream.requests()
    assert len(sent) == len(PATHS)
    for req in sent:
        text = orjson.dumps(req).decode()
        assert f"127.0.0.1:{listener.port}" not in text and "client-chosen-key" not in text, text[:500]
        key = req["headers"].get("authorization", "").removeprefix("Bearer ") or req["headers"].get(
            "x-api-key"
        )
        assert key == "provider-key-from-the-environment"


def url_content(path: str, model: str, url: str) -> dict[str, Any]:
    """Content parts that carry a URL a translating library might fetch itself."""
    if path == CHAT:
        content: Any = [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": url + "/cat.png"}},
            {"type": "file", "file": {"file_id": url + "/doc.pdf"}},
        ]
        return {"model": model, "messages": [{"role": "user", "content": content}]}
    if path == MESSAGES:
        content = [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "url", "url": url + "/cat.png"}},
            {"type": "document", "source": {"type": "url", "url": url + "/doc.pdf"}},
        ]
        return {"model": model, "max_tokens": 32, "messages": [{"role": "user", "content": content}]}
    content = [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": url + "/cat.png"},
        {"type": "input_file", "file_url": url + "/doc.pdf"},
    ]
    return {"model": model, "input": [{"role": "user", "content": content}]}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_urls_in_content_are_never_fetched_by_the_router(
    router: RunningRouter, listener: Listener, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Relayed, a URL is the provider's to fetch; translated, litellm must not fetch it either.

    litellm refuses private addresses by itself; that check is switched off here so that the
    router's own guarantee (no fetch of any client URL, public ones included) is what is tested.
    """
    import litellm

    monkeypatch.setattr(litellm, "user_url_validation", False, raising=False)
    with client(router) as c:
        for path, model in PATHS:
            r = c.post(path, json={**url_content(path, model, listener.url), "stream": stream})
            assert r.status_code < 500 or r.status_code == 502, (path, model, r.status_code, r.text)
            assert "Traceback" not in r.text
    assert listener.seen == []


def test_mcp_tools_that_make_the_provider_connect_are_refused(
    router: RunningRouter, listener: Listener
) -> None:
    mcp = {
        "type": "mcp",
        "server_label": "trap",
        "server_url": listener.url + "/mcp",
        "require_approval": "never",
    }
    with client(router) as c:
        for model in ("local-resp", "local-large", "local-claude"):
            r = c.post(RESPONSES, json={"model": model, "input": "hi", "tools": [mcp]})
            assert r.status_code == 400, r.text
            assert "mcp" in r.json()["error"]["message"].lower()
    assert listener.seen == []


@pytest.mark.parametrize(
    ("path", "model"),
    [
        (CHAT, "openai/{url}"),
        (CHAT, "{url}/v1"),
        (MESSAGES, "claude-{url}/v1"),  # matches the claude-* route: routed, never used as an address
        (RESPONSES, "openai/{url}/v1"),
        (CHAT, "hosted_vllm/{url}"),
    ],
)
def test_model_names_that_look_like_urls(
    router: RunningRouter, upstream: FakeUpstream, listener: Listener, path: str, model: str
) -> None:
    name = model.format(url=listener.url)
    with client(router) as c:
        r = c.post(path, json=body_for(path, name, listener.url, False))
    assert r.status_code in (200, 404), r.text
    if r.status_code == 200:
        assert r.headers["x-router-model"] in ("local-nano", "local-mini", "local-large", "local-claude")
    assert listener.seen == []


# --- credentials: SQL injection and oversize tokens --------------------------------------------

INJECTIONS = [
    "' OR '1'='1",
    "' OR 1=1; --",
    "x'; DROP TABLE keys; --",
    "x'; DROP TABLE requests; --",
    '" OR ""="',
    "rk-' UNION SELECT key_hash FROM keys --aaaaaaaaaaaa",
    "rk-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'",
    "1 OR 1=1",
    "admin'--",
    "%27%20OR%201%3D1",
    "\\x27 OR 1=1",
]


def table_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: conn.execute(f"SELECT COUNT(*) FROM {n}").fetchone()[0] for n in names}


@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_sql_injection_in_the_key_is_a_401(router: RunningRouter, header: str) -> None:
    before = table_counts(router.db_path)
    ids = []
    with httpx.Client(base_url=router.url, timeout=10) as c:
        for token in INJECTIONS:
            value = f"Bearer {token}" if header == "authorization" else token
            for path in (CHAT, MESSAGES, RESPONSES):
                r = c.post(path, json=body_for(path, "auto", "http://x", False), headers={header: value})
                assert r.status_code == 401, (token, r.text)
                assert token not in r.text
                ids.append(r.headers["x-request-id"])
        ok = c.post(CHAT, json=body_for(CHAT, "auto", "http://x", False), headers={"x-api-key": MASTER})
        assert ok.status_code == 200
    deadline = time.monotonic() + 10
    while True:  # the writer batches: wait for these very rows (the last one too), whatever else is written
        rows = {r["request_id"]: r for r in router.records(0)}
        if {*ids, ok.headers["x-request-id"]} <= set(rows) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert all(rows[i]["status"] == 401 and rows[i]["error_type"] == "AuthenticationFailed" for i in ids)
    after = table_counts(router.db_path)
    assert set(after) == set(before) and after["keys"] == before["keys"]
    assert after["requests"] >= before["requests"] + len(ids) + 1


@pytest.mark.parametrize("size", [257, 10_000, 60_000, 1_000_000])
@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_oversize_keys_are_refused_without_a_5xx(router: RunningRouter, header: str, size: int) -> None:
    token = "rk-" + "A" * size
    value = f"Bearer {token}" if header == "authorization" else token
    with httpx.Client(base_url=router.url, timeout=10) as c:
        try:
            r = c.post(CHAT, json=body_for(CHAT, "auto", "http://x", False), headers={header: value})
        except httpx.RemoteProtocolError:
            status = None  # the HTTP server itself dropped a request with huge headers: fine
        else:
            status = r.status_code
            assert token[:200] not in r.text
        assert status is None or 400 <= status < 500, status
        if size <= 10_000:
            assert status == 401
        ok = c.post(CHAT, json=body_for(CHAT, "auto", "http://x", False), headers={"x-api-key": MASTER})
        assert ok.status_code == 200


# --- bodies: nesting, size, encoding, numbers, tool schemas -----------------------------------


def test_deeply_nested_json_is_a_400(router: RunningRouter) -> None:
    deep = (
        b'{"model": "auto", "messages": [{"role": "user", "content": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}]}"
    )
    deep_obj = b'{"model": "auto", "input": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"
    with client(router) as c:
        for path in (CHAT, MESSAGES, RESPONSES):
            for raw in (deep, deep_obj):
                r = c.post(path, content=raw, headers={"content-type": "application/json"})
                assert r.status_code == 400, r.text
        # Deep but within the parser's limit: a clear 4xx (or a served request), never a 5xx.
        for depth in (200, 900):
            nested: Any = "x"
            for _ in range(depth):
                nested = [nested]
            for path, model in PATHS:
                r = c.post(path, json=_with_content(path, model, nested))
                assert r.status_code < 500, (path, model, depth, r.text)
        assert c.post(CHAT, json=body_for(CHAT, "auto", "http://x", False)).status_code == 200


def _with_content(path: str, model: str, content: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": model, "messages": [{"role": "user", "content": content}]}
    if path == MESSAGES:
        return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    return {"model": model, "input": [{"role": "user", "content": content}]}


def test_huge_json(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> None:
    r = router_factory(local_policy(upstream.url), max_body_bytes=2_000_000)
    many = {"model": "auto", "messages": [{"role": "user", "content": "x"}] * 150_000}
    raw = orjson.dumps(many)
    assert len(raw) > 2_000_000

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(raw), 65536):
            yield raw[i : i + 65536]

    with httpx.Client(base_url=r.url, timeout=30) as c:
        for path in (CHAT, MESSAGES, RESPONSES):
            assert c.post(path, content=raw).status_code == 413
            # No Content-Length: the cap applies while reading.
            assert c.post(path, content=chunks()).status_code == 413
        # A lying Content-Length: the server reads what it was told, never more.
        wide = {"model": "auto", "messages": [{"role": "user", "content": "y" * 100}] * 5_000}
        resp = c.post(CHAT, json=wide)
        assert resp.status_code in (200, 400), resp.text
        assert c.post(
            CHAT, json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        ).is_success


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "auto", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "auto", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # encoded surrogate
        b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',  # escaped lone surrogate
        b'\xef\xbb\xbf{"model": "auto", "messages": [{"role": "user", "content": "bom"}]}',
        b'{"model": "auto\xc0\xaf", "messages": [{"role": "user", "content": "overlong"}]}',
        b"\x00\x00\x00{",
        b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}\x00trailing',
    ],
)
def test_invalid_utf8_is_a_400(router: RunningRouter, raw: bytes) -> None:
    with client(router) as c:
        for path in (CHAT, MESSAGES, RESPONSES, "/v1/route", "/v1/messages/count_tokens"):
            r = c.post(path, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            r.json()  # the error itself is valid JSON


ABSURD = [10**12, 10**30, -1, 0, 1.5, "many", "1000", True, [], {}, 1e300]


@pytest.mark.parametrize("value", ABSURD, ids=repr)
def test_absurd_max_tokens_is_a_400(router: RunningRouter, value: Any) -> None:
    cases = [
        (CHAT, {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (CHAT, {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}, "max_completion_tokens"),
        (MESSAGES, {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (RESPONSES, {"model": "auto", "input": "hi"}, "max_output_tokens"),
    ]
    with client(router) as c:
        for path, body, field in cases:
            r = c.post(path, json={**body, field: value})
            assert r.status_code == 400, (path, field, value, r.text)
            assert "Traceback" not in r.text


NOT_SCHEMAS: list[Any] = [
    "x",
    42,
    [],
    ["type", "object"],
    {"type": 5},
    {"type": "object", "properties": "x"},
    {"type": "object", "properties": {"a": "string"}},
    {"type": "object", "required": "a"},
    {"type": "object", "properties": {"a": {"type": ["string", 7]}}},
]


def tools_body(path: str, model: str, schema: Any) -> dict[str, Any]:
    if path == CHAT:
        tool: Any = {"type": "function", "function": {"name": "f", "parameters": schema}}
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    if path == MESSAGES:
        tool = {"name": "f", "input_schema": schema}
        return {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool],
        }
    tool = {"type": "function", "name": "f", "parameters": schema}
    return {"model": model, "input": "hi", "tools": [tool]}


@pytest.mark.parametrize("schema", NOT_SCHEMAS, ids=repr)
def test_tool_schemas_that_are_not_json_schema_are_a_400(router: RunningRouter, schema: Any) -> None:
    with client(router) as c:
        for path, model in PATHS:
            r = c.post(path, json=tools_body(path, model, schema))
            assert r.status_code == 400, (path, model, r.text)
            assert "Traceback" not in r.text


def test_garbage_tool_lists_are_a_400(router: RunningRouter) -> None:
    deep: Any = {"type": "object"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    garbage: list[tuple[str, Any]] = [
        (CHAT, "x"),
        (CHAT, [1]),
        (CHAT, [{"type": "function", "function": "f"}]),
        (CHAT, [{"type": "function", "function": {"parameters": {}}}]),
        (MESSAGES, "x"),
        (MESSAGES, [1]),
        (MESSAGES, [{"input_schema": {}}]),
        (RESPONSES, "x"),
        (RESPONSES, [1]),
        (RESPONSES, [{"type": "function", "parameters": {"type": "object"}}]),
    ]
    with client(router) as c:
        for path, tools in garbage:
            base = tools_body(path, "auto" if path != MESSAGES else "claude-x", {})
            r = c.post(path, json={**base, "tools": tools})
            assert r.status_code == 400, (path, tools, r.text)
        for path, model in PATHS:
            r = c.post(path, json=tools_body(path, model, deep))
            assert r.status_code == 400, (path, model, r.text)
            assert "deep" in r.text


# --- configuration: the policy file and the learned artifact ----------------------------------


def write_policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


GOOD_MODEL = """
models:
  - id: m
    litellm_model: openai/m
    protocol: openai
    api_base: http://127.0.0.1:9/v1
    prices: {input: 1, output: 2}
    context_window: 1000
    max_output_tokens: 100
routes:
  - match: auto
    passthrough: m
"""

BAD_POLICIES = {
    "unknown top-level key": ("version: 1\nmodles: []\n" + GOOD_MODEL, "modles: unknown field (did you mean 'models'?)"),
    "unknown nested key": (GOOD_MODEL.replace("    context_window", "    api_bse: http://x\n    context_window"),
                           "models[0] (id 'm').api_bse: unknown field (did you mean 'api_base'?)"),
    "wrong type": (GOOD_MODEL.replace("context_window: 1000", "context_window: lots"), "models[0] (id 'm').context_window"),
    "list for a mapping": (GOOD_MODEL.replace("prices: {input: 1, output: 2}", "prices: [1, 2]"), "models[0] (id 'm').prices"),
    "string for a list": (GOOD_MODEL + "rules: all\n", "rules"),
    "api_base not http": (GOOD_MODEL.replace("http://127.0.0.1:9/v1", "file:///etc/passwd"), "api_base"),
    "key in place of a variable name": (GOOD_MODEL.replace("    prices", "    api_key_env: sk-live-123\n    prices"),
                                        "api_key_env"),
    "rule on an unknown feature": (GOOD_MODEL + "rules:\n  - {name: r, when: {__class__: 1}, only: [m]}\n", "rules[0]"),
    "alias bomb": ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
    ) + GOOD_MODEL, "expands to more than"),
    "recursive alias": ("a: &a [*a]\n" + GOOD_MODEL, "expands to more than"),
    "two documents": (GOOD_MODEL + "---\n" + GOOD_MODEL, "not valid YAML"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_POLICIES))
def test_bad_policy_files_are_refused_at_startup(tmp_path: Path, case: str) -> None:
    from router.app.factory import build_services
    from router.app.settings import Settings
    from router.errors import ConfigError
    from router.policy.loading import load_policy

    text, expected = BAD_POLICIES[case]
    path = write_policy(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(path) in str(err.value) and expected in str(err.value), str(err.value)
    with pytest.raises(ConfigError):
        build_services(Settings(config=path, store=f"sqlite:///{tmp_path / 'x.db'}"))


TAGS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
    "!!python/name:os.system",
    "!!python/module:os",
    '!!python/object/apply:builtins.exec [\'open("{marker}", "w")\']',
]


@pytest.mark.parametrize("tag", TAGS)
def test_python_tags_in_a_policy_never_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    from router.app.cli import main

    marker = tmp_path / "pwned"
    for where in ("name: {tag}\n", "models:\n  - id: {tag}\n"):
        text = (
            "version: 1\n"
            + where.format(tag=tag.format(marker=marker))
            + GOOD_MODEL.replace("models:\n", "", 1)
        )
        path = write_policy(tmp_path, text)
        assert main(["check", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert "not valid YAML" in err and "python" in err
    assert not marker.exists()


def artifact_bytes() -> bytes:
    from router.features.task.vector import HASH_DIM, NUMERIC, schema
    from router.policy.artifact import FORMAT

    width = len(NUMERIC) + HASH_DIM
    params = {
        "weights": [0.0] * width,
        "platt": [1.0, 0.0],
        "cost_weights": [0.0] * len(NUMERIC),
    }
    return orjson.dumps({"format": FORMAT, "feature_schema": schema(), "models": {"m": params}})


def learned_policy(tmp_path: Path, sha: str) -> Path:
    return write_policy(
        tmp_path, f"version: 1\nlearned: {{artifact: learned.json, sha256: {sha}}}\n" + GOOD_MODEL
    )


def test_a_learned_artifact_must_match_its_pin(tmp_path: Path) -> None:
    from router.errors import ConfigError
    from router.policy.active import PolicyWatcher, load_active_policy

    raw = artifact_bytes()
    (tmp_path / "learned.json").write_bytes(raw)
    path = learned_policy(tmp_path, hashlib.sha256(raw).hexdigest())
    runtime = load_active_policy(path)  # the pinned artifact loads
    assert runtime.decider.scorer.name.startswith("learned:")

    tampered = raw.replace(b'"platt":[1.0,0.0]', b'"platt":[9.0,0.0]')
    assert tampered != raw
    (tmp_path / "learned.json").write_bytes(tampered)
    with pytest.raises(ConfigError) as err:
        load_active_policy(path)
    assert "sha256 mismatch" in str(err.value)
    # A running router that sees the change keeps the policy it has.
    installed: list[object] = []
    watcher = PolicyWatcher(path, installed.append, runtime)
    os.utime(tmp_path / "learned.json", ns=(1, 1))
    assert watcher.check(runtime) is False and installed == []

    # Pinned, but not an artifact: a pickle is refused as "not JSON", never unpickled.
    import pickle

    evil = pickle.dumps(os.system)
    (tmp_path / "learned.json").write_bytes(evil)
    path = learned_policy(tmp_path, hashlib.sha256(evil).hexdigest())
    with pytest.raises(ConfigError) as err:
        load_active_policy(path)
    assert "not JSON" in str(err.value)


@pytest.mark.parametrize("origin", ["http://evil.example", "http://evil.example:8080", "null"])
def test_a_web_page_cannot_spend_through_an_open_router(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, origin: str
) -> None:
    """In open mode (no key needed) a page any site serves could make its visitor's browser call the
    router: a form-like POST (``text/plain``, so no CORS preflight) was served, spending the
    operator's provider keys, and a site whose name it rebinds to 127.0.0.1 could read the reply
    too (found by a hostile probe). A request a browser sends from a page (``Origin``) not on this
    machine is refused with a 403; agents, SDKs and scripts send no ``Origin`` and are served."""
    upstream.clear()
    opened = router_factory(local_policy(upstream.url))  # no master key, no virtual key: open
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "spend"}]})
    page = {"content-type": "text/plain;charset=UTF-8", "origin": origin}
    with httpx.Client(base_url=opened.url, timeout=20) as c:
        sent_before = len(upstream.requests())
        for path in (CHAT, "/v1/outcomes", "/v1/route"):
            refused = c.post(path, content=body, headers=page)
            assert refused.status_code == 403, (path, refused.text)
            assert "web page" in refused.json()["error"]["message"]
        assert len(upstream.requests()) == sent_before  # no provider was called
        assert c.post(CHAT, content=body).status_code == 200
        local = c.post(CHAT, content=body, headers={**page, "origin": opened.url})
        assert local.status_code == 200, local.text


def test_a_site_that_rebinds_its_name_to_this_machine_reads_nothing_of_an_open_router(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """A page of evil.example whose name it rebinds to 127.0.0.1 calls the router same-origin: its
    GETs carry no ``Origin``, so the dashboard, the task ledger and the JSON APIs answered it (and
    it could read them), and the dashboard's preview form took its ``Origin`` for the router's own.
    In open mode the ``Host`` it sends (its own name) is refused, in the endpoint's own shape;
    loopback names, and a name the operator allows, are served."""
    upstream.clear()
    opened = router_factory(local_policy(upstream.url))  # open: no master key, no virtual key
    port = opened.url.rsplit(":", 1)[1]
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "spend"}]})
    rebound = {"host": f"evil.example:{port}"}
    with httpx.Client(base_url=opened.url, timeout=20) as c:
        sent_before = len(upstream.requests())
        for path in ("/v1/models", "/v1/tasks/t-1", "/v1/policy", "/openapi.json"):
            refused = c.get(path, headers=rebound)
            assert refused.status_code == 403, (path, refused.text)
            assert_protocol_shaped(refused.status_code, refused.text, path)
            assert "evil.example" in refused.json()["error"]["message"]
        for path in (CHAT, MESSAGES, "/v1/route", "/v1/outcomes"):
            for page in ({}, {"origin": f"http://evil.example:{port}"}):
                refused = c.post(
                    path, content=body, headers={**rebound, **page, "content-type": "text/plain"}
                )
                assert refused.status_code == 403, (path, page, refused.text)
                assert_protocol_shaped(refused.status_code, refused.text, path)
        for path in ("/ui", "/ui/tasks", "/ui/latency", "/ui/policy", "/ui/tasks/t-1"):
            refused = c.get(path, headers=rebound)
            assert refused.status_code == 403, (path, refused.text)
            assert "Traceback" not in refused.text and "evil.example" in refused.text
        form = {**rebound, "origin": f"http://evil.example:{port}"}
        preview = c.post("/ui/policy/preview", data={"yaml": "version: 1"}, headers=form)
        assert preview.status_code == 403, preview.text
        assert len(upstream.requests()) == sent_before  # no provider was called
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.3.4.5", "LOCALHOST"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
            assert c.get("/ui", headers={"host": host}).status_code == 200, host
        assert c.post(CHAT, content=body).status_code == 200
        # A name that merely starts as a loopback one does is a name like any other.
        assert c.get("/v1/models", headers={"host": "localhost.evil.example"}).status_code == 403
        assert c.get("/v1/models", headers={"host": "127.0.0.1.evil.example"}).status_code == 403
    # Health probes and metrics stay open, as in every mode (scrapers call them by a service's name).
    with httpx.Client(base_url=opened.url, timeout=20) as c:
        assert c.get("/healthz", headers=rebound).status_code == 200


def test_an_open_router_serves_a_name_its_operator_allows(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """``ROUTER_ALLOWED_HOSTS`` names the hosts (beyond loopback) an open router answers to: its
    LAN name, say, or every subdomain of one (``*.lan``); any other name is still refused."""
    upstream.clear()
    opened = router_factory(local_policy(upstream.url), allowed_hosts="devbox.lan, *.corp.example")
    port = opened.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=opened.url, timeout=20) as c:
        for host in (f"devbox.lan:{port}", "DEVBOX.LAN", f"a.corp.example:{port}"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
            assert c.get("/ui", headers={"host": host}).status_code == 200, host
        for host in (f"evil.example:{port}", "corp.example", "devbox.lan.evil.example"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 403, host


def test_an_open_routers_own_page_reached_by_an_allowed_name_may_post(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """The dashboard reached by a LAN name its operator allows posts its forms with that name as
    ``Origin``: refused as another site's page (only loopback origins passed), so its policy preview
    answered 403. A page of the router's own origin (``Origin`` host:port the request's allowed
    ``Host``) is served; another name, or another port of the same name, is still another site."""
    upstream.clear()
    policy = local_policy(upstream.url)
    opened = router_factory(policy, allowed_hosts="devbox.lan")
    port = opened.url.rsplit(":", 1)[1]
    own = {"host": f"devbox.lan:{port}", "origin": f"http://devbox.lan:{port}"}
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    with httpx.Client(base_url=opened.url, timeout=30) as c:
        preview = c.post("/ui/policy/preview", data={"yaml": yaml.safe_dump(policy)}, headers=own)
        assert preview.status_code == 200, preview.text[:500]
        served = c.post(CHAT, content=body, headers={**own, "content-type": "application/json"})
        assert served.status_code == 200, served.text
        for origin in (f"http://devbox.lan:{int(port) + 1}", f"http://other.lan:{port}", "null"):
            refused = c.post(CHAT, content=body, headers={**own, "origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
            refused = c.post("/ui/policy/preview", data={"yaml": "x: 1"}, headers={**own, "origin": origin})
            assert refused.status_code == 403, (origin, refused.text)
