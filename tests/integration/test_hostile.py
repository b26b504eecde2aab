"""Hostile input: nothing a client sends can steer the upstream, crash the router or touch the store.

The SSRF proof runs a second TCP listener on 127.0.0.1 that records every connection, puts its
address in every field that could steer a provider call, sends requests in all three protocols
over both the relay and the litellm-translated paths, and asserts the listener saw nothing.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

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


@pytest.fixture
def router(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> RunningRouter:
    monkeypatch.setenv("ROUTER_HOSTILE_PROVIDER_KEY", "provider-key-from-the-environment")
    upstream.clear()
    return router_factory(hostile_policy(upstream.url), master_key=MASTER)


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
        key = req["headers"].get("authorization", "").removeprefix("Bearer ") or req["headers"].get("x-api-key")
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


def test_mcp_tools_that_make_the_provider_connect_are_refused(router: RunningRouter, listener: Listener) -> None:
    mcp = {"type": "mcp", "server_label": "trap", "server_url": listener.url + "/mcp", "require_approval": "never"}
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
    with httpx.Client(base_url=router.url, timeout=10) as c:
        assert c.post(CHAT, json=body_for(CHAT, "auto", "http://x", False), headers={"x-api-key": MASTER}).is_success
        router.records(1)
        before = table_counts(router.db_path)
        for token in INJECTIONS:
            value = f"Bearer {token}" if header == "authorization" else token
            for path in (CHAT, MESSAGES, RESPONSES):
                r = c.post(path, json=body_for(path, "auto", "http://x", False), headers={header: value})
                assert r.status_code == 401, (token, r.text)
                assert token not in r.text
    rows = router.records(before["requests"] + 3 * len(INJECTIONS))
    after = table_counts(router.db_path)
    assert set(after) == set(before) and after["keys"] == before["keys"]
    assert after["requests"] == len(rows) >= before["requests"] + 3 * len(INJECTIONS)
    assert all(r["status"] in (200, 401) for r in rows)


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
    deep = b'{"model": "auto", "messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
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
        assert c.post(CHAT, json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]}).is_success


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "auto", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "auto", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # encoded surrogate
        b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',  # escaped lone surrogate
        b'\xef\xbb\xbf{"model": "auto", "messages": [{"role": "user", "content": "bom"}]}',
        b'{"model": "auto\xc0\xaf", "messages": [{"role": "user", "content": "overlong"}]}',
        b'\x00\x00\x00{',
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
    None,
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
        return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    tool = {"type": "function", "name": "f", "parameters": schema}
    return {"model": model, "input": "hi", "tools": [tool]}


@pytest.mark.parametrize("schema", NOT_SCHEMAS, ids=repr)
def test_tool_schemas_that_are_not_json_schema_are_a_400(router: RunningRouter, schema: Any) -> None:
    if schema is None:
        pytest.skip("no parameters at all is a valid tool")
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
