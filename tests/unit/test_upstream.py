"""Forwarding (router.forward.upstream) against the fake provider: what is sent, and each failure's error."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from router.errors import BadRequest, RateLimited, UpstreamError, UpstreamTimeout
from router.fakeupstream import FakeUpstream
from router.forward.upstream import _error_text, _retry_after, provider_body, provider_json, relay_base
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, WIRES
from tests.unit.requestpath import calls, catalog, closed_port, model, request, upstream

# -- the provider's body ---------------------------------------------------------------------------------


def test_body_gets_the_wire_model_and_output_limits_fitted(fake: FakeUpstream) -> None:
    b = catalog(model("a", fake.url))["a"]  # max_output_tokens 1000
    body = provider_body(request(max_tokens=5000), b)
    assert body["model"] == b.wire_model == b.litellm_model.removeprefix("openai/")
    assert body["max_tokens"] == 1000
    assert provider_body(request(max_tokens=999), b)["max_tokens"] == 999
    assert provider_body(request(max_completion_tokens=1001), b)["max_completion_tokens"] == 1000
    assert provider_body(request(OPENAI_RESPONSES, max_output_tokens=4000), b)["max_output_tokens"] == 1000


def test_chat_stream_asks_for_usage_and_keeps_the_clients_options(fake: FakeUpstream) -> None:
    b = catalog(model("a", fake.url))["a"]
    assert provider_body(request(stream=True), b)["stream_options"] == {"include_usage": True}
    assert "stream_options" not in provider_body(request(), b)
    asked = provider_body(request(stream=True, stream_options={"include_usage": False}), b)
    assert asked["stream_options"] == {"include_usage": True}


def test_thinking_is_dropped_only_for_backends_without_it(fake: FakeUpstream) -> None:
    cat = catalog(
        model("plain", fake.url, protocol="anthropic"),
        model("thinker", fake.url, protocol="anthropic", capabilities={"thinking": True}),
    )
    req = request(ANTHROPIC, max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024})
    assert "thinking" not in provider_body(req, cat["plain"])
    assert provider_body(req, cat["thinker"])["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert req.body["thinking"]  # the client's request is not changed


def test_the_relayed_bytes_are_the_body_as_orjson_writes_it(fake: FakeUpstream) -> None:
    b = catalog(model("a", fake.url))["a"]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    for req in (request(stream=True, max_tokens=5000, tools=tools), request(ANTHROPIC, max_tokens=10)):
        body = provider_body(req, b)
        assert provider_json(req, body) == orjson.dumps(body)
        assert orjson.loads(provider_json(req, body))["model"] == b.wire_model  # changed here, encoded here
    req = request(messages=[{"role": "user", "content": "hi"}])
    body = provider_body(req, b)
    body["messages"] = [{"role": "user", "content": "other"}]  # a new value is never the client's bytes
    assert orjson.loads(provider_json(req, body))["messages"][0]["content"] == "other"


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
def test_bodies_orjson_could_not_write_are_refused_and_no_others(protocol: str) -> None:
    # orjson writes 254 levels of arrays and objects: the body's own object and 253 inside it.
    def body(levels: int) -> bytes:
        conversation = (
            b'"input":"hi"'
            if protocol == OPENAI_RESPONSES
            else b'"messages":[{"role":"user","content":"hi"}]'
        )
        deep = b"[" * levels + b'"x"' + b"]" * levels
        return b'{"model":"m","max_tokens":5,' + conversation + b',"metadata":{"deep":' + deep + b"}}"

    for levels, ok in ((252, True), (253, False)):  # with the body's object and metadata's: 254, 255
        fits = True
        try:
            orjson.dumps(orjson.loads(body(levels)))
        except orjson.JSONEncodeError:
            fits = False
        assert fits is ok
        try:
            WIRES[protocol].parse(body(levels))
            refused = False
        except BadRequest as err:
            refused = "nested too deeply" in err.message
        assert refused is not ok, (protocol, levels)


def test_relay_only_to_a_backend_speaking_the_clients_protocol(fake: FakeUpstream) -> None:
    cat = catalog(
        model("chat", fake.url),
        model("claude", fake.url, protocol="anthropic"),
        {"id": "hosted", "litellm_model": "anthropic/claude-x", "protocol": "anthropic",
         "prices": {"input": 1, "output": 1}, "context_window": 1000, "max_output_tokens": 100},
    )  # fmt: skip
    assert relay_base(cat["chat"], OPENAI_CHAT) == fake.url + "/v1"
    assert relay_base(cat["chat"], ANTHROPIC) is None
    assert relay_base(cat["chat"], OPENAI_RESPONSES) is None
    assert relay_base(cat["claude"], ANTHROPIC) == fake.url
    assert relay_base(cat["hosted"], ANTHROPIC) == "https://api.anthropic.com"


# -- headers ---------------------------------------------------------------------------------------------


async def test_openai_key_is_a_bearer_token(fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_TEST_KEY", "sk-test-123")
    cat = catalog(model("a", fake.url, api_key_env="ROUTER_TEST_KEY"), model("open", fake.url))
    async with upstream() as up:
        await up.complete(request(), cat["a"], {"authorization": "Bearer client-key", "user-agent": "agent"})
        await up.complete(request(), cat["open"], {})
    headers = calls(fake, cat["a"])[-1]["headers"]
    assert headers["authorization"] == "Bearer sk-test-123"  # ours, never the client's
    assert headers["user-agent"] == "router/0.1"
    assert "authorization" not in calls(fake, cat["open"])[-1]["headers"]


async def test_anthropic_headers(fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_TEST_KEY", "sk-ant-123")
    cat = catalog(model("c", fake.url, protocol="anthropic", api_key_env="ROUTER_TEST_KEY"))
    async with upstream() as up:
        await up.complete(request(ANTHROPIC), cat["c"], {})
        default = calls(fake, cat["c"])[-1]["headers"]
        given = {"anthropic-version": "2024-01-01", "anthropic-beta": "tools-2024, files-1"}
        await up.complete(request(ANTHROPIC), cat["c"], given)
        passed = calls(fake, cat["c"])[-1]["headers"]
        await up.complete(
            request(ANTHROPIC), cat["c"], {"anthropic-version": "x\r\ny", "anthropic-beta": "A;B"}
        )
        refused = calls(fake, cat["c"])[-1]["headers"]
    assert default["x-api-key"] == "sk-ant-123" and "authorization" not in default
    assert default["anthropic-version"] == "2023-06-01" and "anthropic-beta" not in default
    assert passed["anthropic-version"] == "2024-01-01" and passed["anthropic-beta"] == "tools-2024, files-1"
    assert refused["anthropic-version"] == "2023-06-01" and "anthropic-beta" not in refused


# -- replies and failures --------------------------------------------------------------------------------


async def test_relayed_reply_keeps_the_providers_bytes(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "text=exactly these words"))
    async with upstream() as up:
        reply = await up.complete(request(), cat["a"], {})
    assert reply.raw is not None and reply.body() is reply.raw
    assert reply.obj["choices"][0]["message"]["content"] == "exactly these words"


async def test_error_status_maps_onto_the_error_tree(fake: FakeUpstream) -> None:
    cat = catalog(
        model("limited", fake.url, "status=429,retry_after=7"),
        model("rejected", fake.url, "status=401"),
        model("down", fake.url, "status=500"),
    )
    async with upstream() as up:
        with pytest.raises(RateLimited) as limited:
            await up.complete(request(), cat["limited"], {})
        with pytest.raises(UpstreamError) as rejected:
            await up.complete(request(), cat["rejected"], {})
        with pytest.raises(UpstreamError) as down:
            await up.complete(request(), cat["down"], {})
    assert limited.value.retry_after == 7.0
    assert "backend 'limited' answered 429: fake upstream: injected 429" in limited.value.message
    # The provider refused the router's key: the operator's problem, another backend may serve.
    assert rejected.value.status == 502 and rejected.value.upstream_status == 401
    assert rejected.value.next_candidate and not rejected.value.retryable
    assert down.value.status == 502 and down.value.retryable and down.value.upstream_status == 500


@pytest.mark.parametrize(
    ("protocol", "family"),
    [(OPENAI_CHAT, "openai"), (ANTHROPIC, "anthropic"), (OPENAI_RESPONSES, "openai_responses")],
)
async def test_context_length_error_is_marked_for_fallover(
    fake: FakeUpstream, protocol: str, family: str
) -> None:
    """Each provider says it its own way (Anthropic has no error code for it, only a message)."""
    cat = catalog(
        model("small", fake.url, "context_window=1", protocol=family), model("other", fake.url, "status=400")
    )
    async with upstream() as up:
        with pytest.raises(UpstreamError) as too_long:
            await up.complete(request(protocol), cat["small"], {})
        with pytest.raises(UpstreamError) as other:
            await up.complete(request(), cat["other"], {})
    assert too_long.value.status == 400 and too_long.value.code == "context_length_exceeded"
    assert other.value.status == 400 and other.value.code is None


async def test_a_key_the_provider_echoes_is_redacted(
    fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake's error message names the model: a model named like the key makes it echo the key.
    cat = catalog(model("echo", fake.url, "status=401", api_key_env="ROUTER_TEST_KEY"))
    key = cat["echo"].wire_model.split("@")[0]
    monkeypatch.setenv("ROUTER_TEST_KEY", key)
    async with upstream() as up:
        with pytest.raises(UpstreamError) as info:
            await up.complete(request(), cat["echo"], {})
    assert key not in info.value.message and "[redacted]" in info.value.message


async def test_a_key_echoed_in_a_reply_that_did_not_stream_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A gateway that answers a stream request with a whole JSON error naming the key it refused;
    # its message went into the router's error (to the client, the log and the console) as it was.
    async def refuse(request: web.Request) -> web.Response:
        key = request.headers["authorization"].removeprefix("Bearer ")
        return web.json_response({"error": {"message": f"key {key} is not valid"}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        monkeypatch.setenv("ROUTER_TEST_KEY", "sk-gateway-echoed-0123456789")
        cat = catalog(model("gw", str(server.make_url("")).rstrip("/"), api_key_env="ROUTER_TEST_KEY"))
        async with upstream() as up:
            with pytest.raises(UpstreamError, match="did not stream") as info:
                await up.open_stream(request(stream=True), cat["gw"], {})
    finally:
        await server.close()
    assert (
        "sk-gateway-echoed" not in info.value.message and "key [redacted] is not valid" in info.value.message
    )


def test_a_key_across_the_cut_of_an_error_message_leaves_nothing() -> None:
    key = "sk-straddle-0123456789abcdef"
    raw = orjson.dumps({"error": {"message": "x" * 290 + key}})
    assert _error_text(raw, key) == "x" * 290 + "[redacted]"


async def test_reply_that_is_not_json(fake: FakeUpstream) -> None:
    cat = catalog(model("bad", fake.url, "malformed=1"))
    async with upstream() as up:
        with pytest.raises(UpstreamError, match="'bad' sent a reply that is not JSON"):
            await up.complete(request(), cat["bad"], {})


async def test_unreachable_backend(fake: FakeUpstream) -> None:
    cat = catalog(model("gone", f"http://127.0.0.1:{closed_port()}"))
    async with upstream() as up:
        with pytest.raises(UpstreamError, match="'gone' unreachable: Client") as info:
            await up.complete(request(), cat["gone"], {})
    assert info.value.retryable


async def test_connection_dropped_before_the_reply(fake: FakeUpstream) -> None:
    cat = catalog(model("drop", fake.url, "break_after=0"))
    async with upstream() as up:
        with pytest.raises(UpstreamError, match="'drop' unreachable") as info:
            await up.complete(request(), cat["drop"], {})
    assert info.value.retryable


async def test_silent_backend_hits_the_idle_timeout(fake: FakeUpstream) -> None:
    cat = catalog(model("silent", fake.url, "ttft_ms=1000"))
    async with upstream(idle=0.2) as up:
        with pytest.raises(UpstreamTimeout) as info:
            await up.complete(request(), cat["silent"], {})
    assert info.value.which == "idle" and info.value.code == "idle_timeout"


# -- streams ---------------------------------------------------------------------------------------------


async def test_stream_is_relayed_event_by_event(fake: FakeUpstream) -> None:
    cat = catalog(model("a", fake.url, "chunks=3,text=one two three"))
    async with upstream() as up:
        events = [ev async for ev in await up.open_stream(request(stream=True), cat["a"], {})]
    assert events[-1].data == b"[DONE]"
    assert b"".join(ev.raw for ev in events).count(b"chat.completion.chunk") >= 3


async def test_stream_cut_mid_way(fake: FakeUpstream) -> None:
    cat = catalog(model("cut", fake.url, "break_after=2"))
    async with upstream() as up:
        events = await up.open_stream(request(stream=True), cat["cut"], {})
        with pytest.raises(UpstreamError, match="'cut' broke off the stream"):
            async for _ in events:
                pass


async def test_stream_stalled_mid_way_hits_the_idle_timeout(fake: FakeUpstream) -> None:
    cat = catalog(model("stall", fake.url, "stall_after=1,stall_ms=1000"))
    async with upstream(idle=0.2) as up:
        events = await up.open_stream(request(stream=True), cat["stall"], {})
        with pytest.raises(UpstreamTimeout) as info:
            async for _ in events:
                pass
    assert info.value.which == "idle"


async def test_stream_refused_before_it_starts(fake: FakeUpstream) -> None:
    cat = catalog(model("busy", fake.url, "status=529"))
    async with upstream() as up:
        with pytest.raises(UpstreamError) as info:
            await up.open_stream(request(stream=True), cat["busy"], {})
    assert info.value.status == 529 and info.value.retryable


# -- translated through litellm --------------------------------------------------------------------------


async def test_translated_reply_and_stream(fake: FakeUpstream) -> None:
    """An OpenAI client served by an Anthropic backend: litellm converts both ways."""
    cat = catalog(model("claude", fake.url, "text=translated words", protocol="anthropic"))
    async with upstream() as up:
        reply = await up.complete(request(), cat["claude"], {})
        events = [ev async for ev in await up.open_stream(request(stream=True), cat["claude"], {})]
    assert reply.raw is None and reply.obj["choices"][0]["message"]["content"] == "translated words"
    assert b"translated" in b"".join(ev.raw for ev in events)
    assert [r["path"] for r in calls(fake, cat["claude"])] == ["/v1/messages", "/v1/messages"]


async def test_translated_failure_is_a_router_error(fake: FakeUpstream) -> None:
    cat = catalog(model("claude", fake.url, "status=503", protocol="anthropic"))
    async with upstream() as up:
        with pytest.raises(UpstreamError) as info:
            await up.complete(request(), cat["claude"], {})
    assert info.value.retryable


# -- small pure helpers ----------------------------------------------------------------------------------


def test_retry_after_header_values() -> None:
    assert _retry_after(None) is None and _retry_after("") is None
    assert _retry_after("2.5") == 2.5
    assert _retry_after("-3") == 0.0
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None


def test_error_text_is_short_and_never_the_body() -> None:
    assert _error_text(b"<html>oops</html>", None) == "17 bytes, not JSON"
    assert _error_text(b'{"error": {"message": "bad model"}}', None) == "bad model"
    assert _error_text(b'{"error": "plain"}', None) == "plain"
    assert _error_text(b'{"detail": "x"}', None) == "no message"
    assert _error_text(b"[1, 2]", None) == "no message"
    assert _error_text(b'{"error": {"message": "' + b"x" * 1000 + b'"}}', None) == "x" * 300
