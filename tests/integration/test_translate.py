"""Cross-protocol translation through litellm, against the local fake upstream.

Each client protocol is driven to a backend of another protocol, non-streamed and streamed, with
plain text and a tool round trip. The tests check both what reached the upstream (model name,
translated tools, nothing the backend cannot take) and that the reply parses as the client's
protocol; then the error mapping (429, 500, 400, refused connection, broken stream, timeout).
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from router.errors import RateLimited, RouterError, UpstreamError, UpstreamTimeout
from router.fakeupstream import FakeUpstream
from router.forward.translate import Target, complete, open_stream

pytestmark = pytest.mark.integration

KEY = "sk-test-SECRET-0123456789"
SECRET_PROMPT = "PROMPT-SECRET-7731"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS_CHAT = [
    {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": SCHEMA}}
]
TOOLS_ANTHROPIC = [{"name": "get_weather", "description": "d", "input_schema": SCHEMA}]
TOOLS_RESPONSES = [{"type": "function", "name": "get_weather", "description": "d", "parameters": SCHEMA}]


@pytest.fixture(scope="module")
def up() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


def openai_target(up: FakeUpstream, model: str = "gpt-4o-mini", timeout: float = 10) -> Target:
    return Target(f"openai/{model}", up.url + "/v1", KEY, timeout)


def anthropic_target(up: FakeUpstream, model: str = "claude-sonnet-4-5", timeout: float = 10) -> Target:
    return Target(f"anthropic/{model}", up.url, KEY, timeout)


def last_request(up: FakeUpstream) -> dict[str, Any]:
    return up.requests()[-1]


async def collect(frames: AsyncIterator[bytes]) -> list[bytes]:
    return [frame async for frame in frames]


def data_frames(frames: list[bytes]) -> list[dict[str, Any]]:
    """OpenAI chat SSE: every frame is one ``data:`` line; the stream ends with [DONE]."""
    assert frames[-1] == b"data: [DONE]\n\n"
    out = []
    for frame in frames[:-1]:
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n"), frame
        out.append(json.loads(frame[6:]))
    return out


def named_frames(frames: list[bytes]) -> list[dict[str, Any]]:
    """Anthropic / Responses SSE: ``event: name`` then ``data: json`` whose type is the name."""
    out = []
    for frame in frames:
        head, _, rest = frame.partition(b"\n")
        assert head.startswith(b"event: ") and rest.startswith(b"data: ") and rest.endswith(b"\n\n"), frame
        event = json.loads(rest[6:])
        assert event["type"] == head[7:].decode()
        out.append(event)
    return out


def check_anthropic_order(events: list[dict[str, Any]]) -> None:
    types = [e["type"] for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert types[-2] == "message_delta"
    open_index = None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None
            open_index = event["index"]
        elif event["type"] in ("content_block_delta", "content_block_stop"):
            assert event["index"] == open_index
            if event["type"] == "content_block_stop":
                open_index = None
        else:
            assert event["type"] == "ping", event
    assert open_index is None


def check_responses_order(events: list[dict[str, Any]]) -> None:
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress"
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["status"] == "completed"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- OpenAI Chat client -> Anthropic backend ---------------------------------------------------


async def test_chat_to_anthropic_text(up: FakeUpstream) -> None:
    body = {
        "model": "router-auto",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }
    out = await complete("openai_chat", body, anthropic_target(up))
    sent = last_request(up)
    assert sent["path"] == "/v1/messages"
    assert sent["body"]["model"] == "claude-sonnet-4-5"
    assert sent["body"]["max_tokens"] == 64000  # the model's own limit, the client gave none
    assert sent["body"]["system"][0]["text"] == "Be brief."
    assert sent["headers"]["x-api-key"] == KEY
    assert out["object"] == "chat.completion"
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and "fake reply" in message["content"]
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["prompt_tokens"] > 0 and out["usage"]["completion_tokens"] > 0
    assert "provider_specific_fields" not in message


async def test_chat_to_anthropic_tool_round_trip(up: FakeUpstream) -> None:
    target = anthropic_target(up, "claude-unlisted@cached=5")
    ask = {"model": "m", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS_CHAT}
    first = await complete("openai_chat", ask, target)
    sent = last_request(up)["body"]
    assert sent["max_tokens"] == 4096  # unknown model: the fallback, not litellm's huge default
    assert sent["tools"][0]["name"] == "get_weather" and sent["tools"][0]["input_schema"] == SCHEMA
    call = first["choices"][0]["message"]["tool_calls"][0]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(call["function"]["arguments"]) == {"city": "ls"}
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 5

    history = [
        *ask["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    second = await complete("openai_chat", {**ask, "messages": history}, target)
    sent = last_request(up)["body"]
    assert sent["messages"][1]["content"][0] == {
        "type": "tool_use",
        "id": call["id"],
        "name": "get_weather",
        "input": {"city": "ls"},
    }
    assert sent["messages"][2]["content"][0]["type"] == "tool_result"
    assert sent["messages"][2]["content"][0]["tool_use_id"] == call["id"]
    assert second["choices"][0]["message"]["content"] == "Tool result received: sunny"


async def test_chat_to_anthropic_stream_text(up: FakeUpstream) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    chunks = data_frames(await collect(await open_stream("openai_chat", body, anthropic_target(up))))
    assert last_request(up)["body"]["stream"] is True
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello from claude-sonnet-4-5. This is a fake reply."
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0


async def test_chat_to_anthropic_stream_tool(up: FakeUpstream) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "w?"}],
        "tools": TOOLS_CHAT,
        "stream": True,
    }
    chunks = data_frames(await collect(await open_stream("openai_chat", body, anthropic_target(up))))
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or ()]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads("".join(tc["function"].get("arguments", "") for tc in calls)) == {"city": "ls"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] > 0


# -- Anthropic client -> OpenAI backend --------------------------------------------------------

#: What Claude Code sends mid-task: cached system blocks, an earlier turn with signed thinking
#: and a tool call, its result, and fields an OpenAI backend must never see.
CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1000,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "c2lnbmF0dXJl"},
                {"type": "redacted_thinking", "data": "b3BhcXVl"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "sunny"}],
                }
            ],
        },
    ],
    "tools": [{**TOOLS_ANTHROPIC[0], "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 10000},
    "metadata": {"user_id": "user_abc_account__session_42"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "top_k": 5,
    "temperature": 1,
}


async def test_anthropic_to_openai_history_is_cleaned(up: FakeUpstream) -> None:
    out = await complete("anthropic", CLAUDE_CODE_BODY, openai_target(up))
    sent = last_request(up)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["authorization"] == f"Bearer {KEY}"
    body = sent["body"]
    assert body["model"] == "gpt-4o-mini"
    raw = json.dumps(body)
    for banned in ("cache_control", "thinking", "signature", "redacted", "context_management", "metadata"):
        assert banned not in raw, banned
    for banned in ("output_config", "top_k", "user", "reasoning_effort"):  # gpt-4o-mini does not reason
        assert banned not in body, banned
    assert body["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "You are Claude Code."}],
    }
    assistant = body["messages"][2]
    assert assistant["content"] == "Checking."
    assert assistant["tool_calls"][0]["id"] == "toolu_01"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_01", "content": "sunny"}
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": SCHEMA}}
    ]
    assert out["type"] == "message" and out["role"] == "assistant"
    assert out["content"] == [{"type": "text", "text": "Tool result received: sunny"}]
    assert out["stop_reason"] == "end_turn"
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0


async def test_anthropic_thinking_budget_becomes_reasoning_effort(up: FakeUpstream) -> None:
    await complete("anthropic", CLAUDE_CODE_BODY, openai_target(up, "o4-mini"))
    assert last_request(up)["body"]["reasoning_effort"] == "high"
    disabled = {**CLAUDE_CODE_BODY, "thinking": {"type": "disabled"}}
    await complete("anthropic", disabled, openai_target(up, "o4-mini"))
    assert "reasoning_effort" not in last_request(up)["body"]


async def test_anthropic_to_openai_tool_call(up: FakeUpstream) -> None:
    body = {
        "model": "m",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": TOOLS_ANTHROPIC,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    out = await complete("anthropic", body, openai_target(up, "gpt-4o-mini@cached=7"))
    sent = last_request(up)["body"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent["model"] == "gpt-4o-mini@cached=7" and sent["max_tokens"] == 100
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    assert out["stop_reason"] == "tool_use"
    block = out["content"][0]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {"city": "ls"}
    assert out["usage"]["cache_read_input_tokens"] == 7


async def test_anthropic_to_openai_stream_text(up: FakeUpstream) -> None:
    body = {**CLAUDE_CODE_BODY, "stream": True}
    events = named_frames(await collect(await open_stream("anthropic", body, openai_target(up))))
    sent = last_request(up)["body"]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    check_anthropic_order(events)
    assert events[1]["content_block"]["type"] == "text"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Tool result received: sunny"
    delta = events[-2]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["input_tokens"] > 0 and delta["usage"]["output_tokens"] > 0


async def test_anthropic_to_openai_stream_tool(up: FakeUpstream) -> None:
    body = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": TOOLS_ANTHROPIC,
        "stream": True,
    }
    events = named_frames(await collect(await open_stream("anthropic", body, openai_target(up))))
    check_anthropic_order(events)
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    parts = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert json.loads("".join(parts)) == {"city": "ls"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


# -- OpenAI Responses client -> Chat Completions and Anthropic backends -------------------------

#: What Codex sends: a developer message, an earlier turn with an (opaque, OpenAI-encrypted)
#: reasoning item and a function call, its output, and Responses-only fields.
CODEX_BODY: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "env"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "call the tool"}],
            "encrypted_content": "gAAAAopaque",
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ],
    "tools": TOOLS_RESPONSES,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-42",
    "client_metadata": {"x": "y"},
}


async def test_responses_to_chat_backend(up: FakeUpstream) -> None:
    out = await complete("openai_responses", CODEX_BODY, openai_target(up))
    sent = last_request(up)
    assert sent["path"] == "/v1/chat/completions"  # never the Responses API
    body = sent["body"]
    assert body["model"] == "gpt-4o-mini"
    raw = json.dumps(body)
    for banned in ("reasoning", "encrypted", "include", "client_metadata", "store"):
        assert banned not in raw, banned
    assert body["messages"][0]["role"] == "system"
    calls = [m for m in body["messages"] if m.get("tool_calls")]
    assert calls[0]["tool_calls"][0]["id"] == "call_1"
    assert body["messages"][-1] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    tool = body["tools"][0]
    assert tool["type"] == "function" and tool["function"]["name"] == "get_weather"
    assert tool["function"]["parameters"] == SCHEMA
    assert out["object"] == "response" and out["status"] == "completed"
    message = out["output"][-1]
    assert message["type"] == "message"
    assert message["content"][0]["text"] == "Tool result received: sunny"
    assert out["usage"]["input_tokens"] > 0 and out["usage"]["output_tokens"] > 0


async def test_responses_to_anthropic_backend(up: FakeUpstream) -> None:
    out = await complete("openai_responses", CODEX_BODY, anthropic_target(up))
    sent = last_request(up)
    assert sent["path"] == "/v1/messages"
    body = sent["body"]
    raw = json.dumps(body)
    for banned in ("encrypted", "include", "client_metadata", "store", "prompt_cache_key"):
        assert banned not in raw, banned
    # Asked-for reasoning becomes Anthropic thinking, except in a tool loop whose last call has no
    # thinking block to continue from (the opaque OpenAI reasoning item cannot be one).
    assert "thinking" not in raw
    assert [block["text"] for block in body["system"]] == ["You are Codex.", "env"]
    assert body["max_tokens"] == 64000
    assert body["messages"][1]["content"][0]["type"] == "tool_use"
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "call_1",
        "content": "sunny",
    }
    assert out["output"][-1]["content"][0]["text"] == "Tool result received: sunny"


async def test_responses_reasoning_tokens_are_reported(up: FakeUpstream) -> None:
    body = {"model": "m", "input": "hi", "reasoning": {"effort": "high"}}
    out = await complete("openai_responses", body, openai_target(up, "o4-mini"))
    assert last_request(up)["body"]["reasoning_effort"] == "high"
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == 512


async def test_keyless_backend_never_gets_an_environment_key(
    up: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    await complete("anthropic", body, Target("openai/local-model", up.url + "/v1", None, 10))
    assert "sk-from-the-environment" not in json.dumps(last_request(up)["headers"])


async def test_previous_response_id_is_refused(up: FakeUpstream) -> None:
    with pytest.raises(RouterError) as info:
        await complete(
            "openai_responses", {"input": "hi", "previous_response_id": "resp_1"}, openai_target(up)
        )
    assert info.value.status == 400 and info.value.param == "previous_response_id"


async def test_responses_to_chat_backend_tool_call(up: FakeUpstream) -> None:
    body = {"model": "m", "input": "weather?", "tools": TOOLS_RESPONSES}
    out = await complete("openai_responses", body, openai_target(up, "gpt-4o-mini@cached=3"))
    call = out["output"][0]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "ls"} and call["call_id"]
    assert out["usage"]["input_tokens_details"]["cached_tokens"] == 3


async def test_responses_stream_to_chat_backend(up: FakeUpstream) -> None:
    body = {**CODEX_BODY, "stream": True}
    events = named_frames(await collect(await open_stream("openai_responses", body, openai_target(up))))
    assert last_request(up)["body"]["stream_options"] == {"include_usage": True}
    check_responses_order(events)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Tool result received: sunny"
    assert events[-1]["response"]["usage"]["output_tokens"] > 0


async def test_responses_stream_tool_to_anthropic_backend(up: FakeUpstream) -> None:
    body = {"model": "m", "input": "weather?", "tools": TOOLS_RESPONSES, "stream": True}
    events = named_frames(await collect(await open_stream("openai_responses", body, anthropic_target(up))))
    sent = last_request(up)
    assert sent["path"] == "/v1/messages" and sent["body"]["model"] == "claude-sonnet-4-5"
    assert sent["body"]["tools"][0]["input_schema"] == SCHEMA
    check_responses_order(events)
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "ls"}
    done = events[-1]["response"]
    assert done["output"][-1]["type"] == "function_call"
    assert done["usage"]["input_tokens"] > 0


async def test_responses_reasoning_round_trip_with_anthropic(up: FakeUpstream) -> None:
    """Signed thinking comes back as a reasoning item and goes to Anthropic again; opaque ones do not."""
    target = anthropic_target(up)
    ask = {"model": "m", "input": "hi", "reasoning": {"effort": "high"}, "max_output_tokens": 8000}
    first = await complete("openai_responses", ask, target)
    assert last_request(up)["body"]["thinking"]["type"] == "enabled"
    reasoning = [item for item in first["output"] if item["type"] == "reasoning"]
    assert reasoning and reasoning[0]["encrypted_content"]
    opaque = CODEX_BODY["input"][2]
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        opaque,
        *first["output"],
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
    ]
    second = await complete("openai_responses", {**ask, "input": history}, target)
    assert second["status"] == "completed"  # the fake rejects a thinking block it did not sign
    blocks = [b for m in last_request(up)["body"]["messages"] for b in m["content"] if isinstance(b, dict)]
    thinking = [b for b in blocks if b["type"] == "thinking"]
    assert len(thinking) == 1 and thinking[0]["signature"]
    assert "gAAAAopaque" not in json.dumps(last_request(up)["body"])


# -- errors ------------------------------------------------------------------------------------

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("openai_chat", "anthropic", {"model": "m", "messages": [{"role": "user", "content": SECRET_PROMPT}]}),
    (
        "anthropic",
        "openai",
        {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": SECRET_PROMPT}]},
    ),
    ("openai_responses", "openai", {"model": "m", "input": SECRET_PROMPT}),
    ("openai_responses", "anthropic", {"model": "m", "input": SECRET_PROMPT}),
]


def target_for(up: FakeUpstream, family: str, model: str, timeout: float = 10) -> Target:
    return openai_target(up, model, timeout) if family == "openai" else anthropic_target(up, model, timeout)


async def call(
    protocol: str, body: dict[str, Any], target: Target, stream: bool
) -> list[bytes] | dict[str, Any]:
    if stream:
        return await collect(await open_stream(protocol, {**body, "stream": True}, target))
    return await complete(protocol, body, target)


def check_clean(err: RouterError) -> None:
    assert KEY not in str(err) and SECRET_PROMPT not in str(err)


# Runs first among the error tests: the fake keeps sleeping after the client gave up.
async def test_overall_timeout_covers_the_stream(up: FakeUpstream) -> None:
    target = anthropic_target(up, "m@stall_after=2,stall_ms=1500", timeout=0.5)
    with pytest.raises(UpstreamTimeout) as info:
        await call("openai_chat", CASES[0][2], target, stream=True)
    assert info.value.which == "overall"
    with pytest.raises(UpstreamTimeout):
        await complete("anthropic", CASES[1][2], openai_target(up, "m@ttft_ms=1500", timeout=0.5))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "family", "body"), CASES)
async def test_rate_limit_raises_before_the_stream(
    up: FakeUpstream, protocol: str, family: str, body: dict[str, Any], stream: bool
) -> None:
    target = target_for(up, family, "m@status=429,retry_after=2")
    with pytest.raises(RateLimited) as info:
        if stream:
            await open_stream(protocol, {**body, "stream": True}, target)  # raises before any frame
        else:
            await complete(protocol, body, target)
    assert info.value.retry_after == 2.0 and info.value.retryable
    check_clean(info.value)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "family", "body"), CASES)
async def test_server_and_client_errors(
    up: FakeUpstream, protocol: str, family: str, body: dict[str, Any], stream: bool
) -> None:
    with pytest.raises(UpstreamError) as info:
        await call(protocol, body, target_for(up, family, "m@status=500"), stream)
    assert info.value.retryable and info.value.upstream_status == 500
    check_clean(info.value)
    with pytest.raises(UpstreamError) as info:
        await call(protocol, body, target_for(up, family, "m@status=400"), stream)
    assert not info.value.retryable and info.value.status == 400 and info.value.upstream_status == 400
    assert "injected 400" in info.value.message  # the provider's own words reach the client
    check_clean(info.value)


async def test_overloaded_anthropic_keeps_its_status(up: FakeUpstream) -> None:
    with pytest.raises(UpstreamError) as info:
        await complete("openai_chat", CASES[0][2], anthropic_target(up, "m@status=529"))
    assert info.value.status == 529 and info.value.retryable


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "family", "body"), CASES[:3])
async def test_connection_refused(protocol: str, family: str, body: dict[str, Any], stream: bool) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    target = Target(f"{family}/m", base + ("/v1" if family == "openai" else ""), KEY, 5)
    with pytest.raises(UpstreamError) as info:
        await call(protocol, body, target, stream)
    assert info.value.upstream_status is None and info.value.retryable
    assert "unreachable" in info.value.message
    check_clean(info.value)


@pytest.mark.parametrize(("protocol", "family", "body"), CASES)
async def test_broken_stream_raises_from_the_iterator(
    up: FakeUpstream, protocol: str, family: str, body: dict[str, Any]
) -> None:
    frames = await open_stream(protocol, {**body, "stream": True}, target_for(up, family, "m@break_after=3"))
    received = []
    with pytest.raises(UpstreamError) as info:
        async for frame in frames:
            received.append(frame)
    assert received, "the frames before the break are delivered"
    assert info.value.retryable
    check_clean(info.value)


async def test_closing_a_stream_early_is_clean(up: FakeUpstream) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    frames = await open_stream("openai_chat", body, anthropic_target(up, "m@chunk_ms=50"))
    first = await anext(frames)
    assert first.startswith(b"data: ")
    await frames.aclose()  # type: ignore[attr-defined]


def test_error_mapping_of_litellm_exceptions() -> None:
    from router.forward.translate.litellm_setup import get_litellm
    from router.forward.translate.upstream_errors import to_router_error

    litellm = get_litellm()
    target = Target("openai/m", None, KEY, 7, connect=2, idle=3)
    too_long = litellm.ContextWindowExceededError(
        message=f"litellm.ContextWindowExceededError: maximum context length exceeded (key {KEY})",
        model="m",
        llm_provider="openai",
    )
    err = to_router_error(too_long, target)
    assert err.status == 400 and err.code == "context_length_exceeded" and not err.retryable
    assert KEY not in err.message and "maximum context length" in err.message
    timeout = to_router_error(litellm.Timeout(message="slow", model="m", llm_provider="openai"), target)
    # The HTTP client's own timeout is the idle (read) one; the overall deadline is asyncio's.
    assert isinstance(timeout, UpstreamTimeout) and timeout.which == "idle" and "3s" in timeout.message
    overall = to_router_error(TimeoutError(), target)
    assert isinstance(overall, UpstreamTimeout) and overall.which == "overall" and "7s" in overall.message
    broken = to_router_error(ValueError(f"cannot translate {SECRET_PROMPT}"), target)
    assert not broken.retryable and broken.next_candidate and SECRET_PROMPT not in broken.message
