"""The fake upstream: pure pieces without a server, then the real server driven by the official SDKs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2  # the HTTP client both SDKs are built on
import openai
import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from router.fakeupstream import Behaviour, BehaviourError, FakeUpstream, parse_spec
from router.fakeupstream.behaviour import merge, split_model
from router.fakeupstream.reply import Planner, Prompt, Tool, example_arguments, sign_thinking, split_text
from router.fakeupstream.server import Recorder

BASH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    "required": ["command"],
}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "bash", "parameters": BASH_SCHEMA}}]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "bash", "parameters": BASH_SCHEMA}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "bash", "description": "run a command", "input_schema": BASH_SCHEMA}]
HI: list[Any] = [{"role": "user", "content": "hi"}]


# -- pure pieces (no server) -------------------------------------------------------------------------


def test_parse_spec_converts_types_and_rejects_unknown_keys() -> None:
    assert dict(parse_spec("ttft_ms=200, chunks=20,malformed=1,tool=never,text=hi there")) == {
        "ttft_ms": 200.0,
        "chunks": 20,
        "malformed": True,
        "tool": "never",
        "text": "hi there",
    }
    with pytest.raises(BehaviourError, match="unknown behaviour key 'speed'"):
        parse_spec("speed=3")
    with pytest.raises(BehaviourError, match="chunks"):
        parse_spec("chunks=0")
    with pytest.raises(BehaviourError, match="status"):
        parse_spec("status=200")


def test_later_layers_override_earlier_ones_field_by_field() -> None:
    default = Behaviour(ttft_ms=50, chunks=4)
    per_model = Behaviour(chunks=10).overrides()
    merged = merge(default, per_model, parse_spec("chunks=3,cached=7"))
    assert (merged.ttft_ms, merged.chunks, merged.cached) == (50, 3, 7)
    assert merge(default) is default
    assert split_model("small@ttft_ms=1,chunks=2") == ("small", "ttft_ms=1,chunks=2")


def test_example_arguments_follow_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "n": {"type": "number"},
            "force": {"type": "boolean"},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "other": {},
        },
        "required": ["command", "n", "force", "mode", "other"],
    }
    assert example_arguments(schema) == {
        "command": ["ls"],
        "n": 1,
        "force": True,
        "mode": "fast",
        "other": None,
    }
    assert example_arguments(BASH_SCHEMA) == {"command": "ls"}


def test_split_text_keeps_every_character() -> None:
    assert split_text("abcdefghij", 3) == ["abc", "def", "ghij"]
    assert split_text("ab", 8) == ["a", "b"]
    assert split_text("", 8) == []


def _prompt(items: list[bytes], head: bytes = b"", marker: int | None = None) -> Prompt:
    return Prompt(model="m", head=head, items=items, tools=[], tool_result=None, cache_marker=marker)


def test_prefix_cache_reports_the_longest_seen_prefix() -> None:
    planner = Planner()
    a, b, c = b"x" * 400, b"y" * 400, b"z" * 400
    first = planner.plan(_prompt([a, b]), Behaviour()).usage
    assert (first.input_tokens, first.cached_tokens) == (200, 0)
    # The next turn repeats both earlier messages: their 200 tokens count as cached.
    second = planner.plan(_prompt([a, b, c], marker=3), Behaviour()).usage
    assert (second.input_tokens, second.cached_tokens, second.cache_creation_tokens) == (300, 200, 100)
    assert planner.plan(_prompt([c, a]), Behaviour(cached=5)).usage.cached_tokens == 5


def test_tool_choice_between_call_and_text() -> None:
    planner = Planner()
    tools = [Tool("bash", BASH_SCHEMA)]
    with_tools = Prompt(model="m", head=b"", items=[b"{}"], tools=tools, tool_result=None)
    call = planner.plan(with_tools, Behaviour()).tool_call
    assert call is not None and call.arguments == {"command": "ls"}
    # tool_arg sets the string arguments: an agent's shell tool runs the command a test chose.
    told = planner.plan(with_tools, merge(Behaviour(), parse_spec("tool_arg=echo DONE"))).tool_call
    assert told is not None and told.arguments == {"command": "echo DONE"}
    assert told.arguments_json == '{"command":"echo DONE"}'
    assert planner.plan(with_tools, Behaviour(tool="never")).tool_call is None
    after = Prompt(model="m", head=b"", items=[b"{}"], tools=tools, tool_result="x" * 50)
    reply = planner.plan(after, Behaviour())
    assert reply.tool_call is None and reply.text == "Tool result received: " + "x" * 40
    assert planner.plan(after, Behaviour(tool="always")).tool_call is not None


def test_recorder_is_bounded_by_count_and_bytes() -> None:
    recorder = Recorder(limit=3, max_bytes=25)
    request = make_mocked_request("POST", "/v1/messages?beta=true", headers={"x-api-key": "k", "cookie": "c"})
    for i in range(4):
        recorder.add(request, orjson.dumps({"n": i}))
    seen = recorder.snapshot()
    assert [r["body"]["n"] for r in seen] == [1, 2, 3]
    assert seen[0]["query"] == {"beta": "true"} and seen[0]["headers"] == {"x-api-key": "k"}
    recorder.add(request, b"x" * 20)  # over the byte budget: older entries go first
    assert [r["body"] for r in recorder.snapshot()] == [None]


# -- the real server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def up() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture
def oai(up: FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.url + "/v1", api_key="sk-test", max_retries=0)


@pytest.fixture
def ant(up: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.url, api_key="ak-test", max_retries=0)


@pytest.mark.integration
def test_chat_completion_text_usage_and_recording(up: FakeUpstream, oai: openai.OpenAI) -> None:
    up.clear()
    done = oai.chat.completions.create(model="chat-plain", messages=HI)
    assert done.choices[0].message.content == "Hello from chat-plain. This is a fake reply."
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None and done.usage.completion_tokens == 8 and done.usage.prompt_tokens > 0
    assert done.usage.completion_tokens_details is not None
    assert done.usage.completion_tokens_details.reasoning_tokens == 0
    (seen,) = up.requests()
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["authorization"] == "Bearer sk-test"
    assert seen["body"]["messages"] == HI


@pytest.mark.integration
def test_chat_stream_chunks_usage_and_reasoning(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="chat-stream@chunks=5",
        messages=HI,
        stream=True,
        stream_options={"include_usage": True},
        reasoning_effort="high",
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.model == "chat-stream" for c in chunks)
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(text) == 5 and "".join(text) == "Hello from chat-stream. This is a fake reply."
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    details = chunks[-1].usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens and details.reasoning_tokens > 0


@pytest.mark.integration
def test_chat_tool_call_round_trip_and_prompt_caching(oai: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "system", "content": "You are terse." * 50}, *HI]
    first = oai.chat.completions.create(model="chat-tools", messages=messages, tools=CHAT_TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "bash" and orjson.loads(call.function.arguments) == {"command": "ls"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md\nsetup.py\nsrc"},
    ]
    stream = oai.chat.completions.create(
        model="chat-tools",
        messages=messages,
        tools=CHAT_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Tool result received: README.md\nsetup.py\nsrc"
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert 0 < (usage.prompt_tokens_details.cached_tokens or 0) < usage.prompt_tokens


@pytest.mark.integration
def test_chat_streamed_tool_call_accumulates(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(model="chat-tools-s", messages=HI, tools=CHAT_TOOLS, stream=True)
    arguments, finish = "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            arguments += tc.function.arguments if tc.function and tc.function.arguments else ""
        finish = chunk.choices[0].finish_reason or finish
    assert orjson.loads(arguments) == {"command": "ls"} and finish == "tool_calls"


@pytest.mark.integration
def test_responses_function_tool_round_trip(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model="resp", input="list files", tools=RESPONSES_TOOLS)
    (item,) = first.output
    assert item.type == "function_call" and item.name == "bash"
    assert orjson.loads(item.arguments) == {"command": "ls"}
    second = oai.responses.create(
        model="resp",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {"type": "function_call", "call_id": item.call_id, "name": "bash", "arguments": item.arguments},
            {"type": "function_call_output", "call_id": item.call_id, "output": "a.txt b.txt"},
        ],
        tools=RESPONSES_TOOLS,
        reasoning={"effort": "low"},
    )
    assert second.output_text == "Tool result received: a.txt b.txt"
    assert second.usage is not None and second.usage.output_tokens_details.reasoning_tokens > 0
    assert second.usage.total_tokens == second.usage.input_tokens + second.usage.output_tokens


@pytest.mark.integration
def test_responses_stream_event_sequence(oai: openai.OpenAI) -> None:
    events = list(oai.responses.create(model="resp-s", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "Hello from resp-s. This is a fake reply." and len(deltas) == 8
    with oai.responses.stream(model="resp-s", input="hi", tools=RESPONSES_TOOLS) as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call" and final.output[0].arguments == '{"command":"ls"}'


@pytest.mark.integration
def test_anthropic_thinking_tool_use_and_signature_round_trip(ant: anthropic.Anthropic) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    first = ant.messages.create(
        model="claude-t", max_tokens=512, messages=HI, tools=ANTHROPIC_TOOLS, thinking=thinking
    )
    assert [b.type for b in first.content] == ["thinking", "tool_use"] and first.stop_reason == "tool_use"
    block, use = first.content
    assert block.type == "thinking" and block.signature == sign_thinking(block.thinking)
    assert use.type == "tool_use" and use.input == {"command": "ls"}
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "ok"}]}
    history: list[Any] = [
        *HI,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    second = ant.messages.create(
        model="claude-t", max_tokens=512, messages=history, tools=ANTHROPIC_TOOLS, thinking=thinking
    )
    assert second.content[-1].type == "text" and second.content[-1].text == "Tool result received: ok"
    assert second.usage.cache_read_input_tokens and second.usage.cache_read_input_tokens > 0
    tampered = {"type": "thinking", "thinking": block.thinking, "signature": "AAAA"}
    history[1] = {"role": "assistant", "content": [tampered, use.model_dump()]}
    with pytest.raises(anthropic.BadRequestError, match="signature"):
        ant.messages.create(model="claude-t", max_tokens=512, messages=history, thinking=thinking)


@pytest.mark.integration
def test_anthropic_stream_events_and_cache_accounting(up: FakeUpstream, ant: anthropic.Anthropic) -> None:
    system: Any = [{"type": "text", "text": "Be brief. " * 100, "cache_control": {"type": "ephemeral"}}]
    with ant.messages.stream(
        model="claude-s",
        max_tokens=512,
        system=system,
        messages=HI,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "low"}},
        extra_query={"beta": "true"},
        metadata={"user_id": "u1"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].type == "thinking" and final.content[0].signature
    assert (
        final.content[1].type == "text"
        and final.content[1].text == "Hello from claude-s. This is a fake reply."
    )
    assert final.usage.cache_creation_input_tokens and final.usage.cache_creation_input_tokens > 200
    assert final.usage.output_tokens > 8
    assert up.requests()[-1]["query"] == {"beta": "true"}


@pytest.mark.integration
def test_anthropic_raw_stream_has_ping_and_usage(up: FakeUpstream) -> None:
    body = {"model": "claude-raw", "max_tokens": 9, "messages": HI, "stream": True}
    text = httpx.post(up.url + "/v1/messages", json=body).text
    events = [block.split("\n")[0].removeprefix("event: ") for block in text.strip().split("\n\n")]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    start = orjson.loads(text.split("\n\n")[0].split("data: ")[1])
    assert start["message"]["usage"]["output_tokens"] == 1
    assert set(start["message"]["usage"]) >= {"input_tokens", "cache_read_input_tokens"}


@pytest.mark.integration
def test_count_tokens(ant: anthropic.Anthropic) -> None:
    small = ant.messages.count_tokens(model="claude-c", messages=HI)
    big = ant.messages.count_tokens(model="claude-c", messages=HI, tools=ANTHROPIC_TOOLS, system="x" * 400)
    assert 0 < small.input_tokens < big.input_tokens


@pytest.mark.integration
def test_rate_limit_surfaces_with_retry_after(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    with pytest.raises(openai.RateLimitError) as oerr:
        oai.chat.completions.create(model="limited@status=429,retry_after=7", messages=HI)
    assert oerr.value.response.headers["retry-after"] == "7"
    assert oerr.value.code == "rate_limit_exceeded"
    with pytest.raises(anthropic.RateLimitError) as aerr:
        ant.messages.create(model="limited@status=429,retry_after=7", max_tokens=5, messages=HI)
    assert aerr.value.response.headers["retry-after"] == "7"
    with pytest.raises(anthropic.OverloadedError):
        ant.messages.create(model="busy@status=529", max_tokens=5, messages=HI)


@pytest.mark.integration
def test_fail_times_then_succeed(up: FakeUpstream, oai: openai.OpenAI) -> None:
    up.set_behaviour("flaky", fail_times=2, status=503)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            oai.chat.completions.create(model="flaky", messages=HI)
    assert oai.chat.completions.create(model="flaky", messages=HI).choices[0].message.content
    up.set_behaviour("flaky", fail_times=1, status=500)  # setting again restarts the count
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model="flaky", messages=HI)


@pytest.mark.integration
def test_break_after_makes_sdk_streams_raise(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    got: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in oai.chat.completions.create(model="broken@break_after=3", messages=HI, stream=True):
            got.append(chunk.choices[0].delta.content or "")
    assert len([g for g in got if g]) == 3
    with (
        pytest.raises((anthropic.APIConnectionError, httpx2.HTTPError)),
        ant.messages.stream(model="broken@break_after=2", max_tokens=5, messages=HI) as stream,
    ):
        stream.get_final_message()


def test_context_window_answers_each_providers_own_error(
    oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    oai.chat.completions.create(model="roomy@context_window=1000", messages=HI)
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model="tight@context_window=1", messages=HI)
    assert chat.value.code == "context_length_exceeded" and "maximum context length is 1 tokens" in str(
        chat.value
    )
    with pytest.raises(openai.BadRequestError) as resp:
        oai.responses.create(model="tight@context_window=1", input="hi")
    assert resp.value.code == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 1 maximum"):
        ant.messages.create(model="tight@context_window=1", max_tokens=5, messages=HI)


def test_error_after_sends_the_providers_error_event(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    got: list[str] = []
    with pytest.raises(openai.APIError, match="injected stream error"):
        for chunk in oai.chat.completions.create(model="err@error_after=2", messages=HI, stream=True):
            got.extend(c.delta.content or "" for c in chunk.choices)
    assert len([g for g in got if g]) == 2
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        ant.messages.stream(model="err@error_after=0", max_tokens=5, messages=HI) as stream,
    ):
        stream.get_final_message()
    events = list(oai.responses.create(model="err@error_after=1", input="hi", stream=True))
    assert [e.type for e in events].count("response.output_text.delta") == 1
    assert events[-1].type == "error" and events[-1].message == "fake upstream: injected stream error"


@pytest.mark.integration
def test_truncate_and_malformed_streams(up: FakeUpstream) -> None:
    body = {"model": "cut@truncate=1", "messages": HI, "stream": True}
    text = httpx.post(up.url + "/v1/chat/completions", json=body).text
    assert "eply." in text and "[DONE]" not in text and '"finish_reason":"stop"' not in text
    body = {"model": "cut@truncate=1", "max_tokens": 5, "messages": HI, "stream": True}
    text = httpx.post(up.url + "/v1/messages", json=body).text
    assert "text_delta" in text and "message_stop" not in text
    body["model"] = "bad@malformed=1"
    with pytest.raises(ValueError):
        for block in httpx.post(up.url + "/v1/messages", json=body).text.strip().split("\n\n"):
            orjson.loads(block.split("data: ", 1)[1])
    response = httpx.post(up.url + "/v1/responses", json={"model": "bad@malformed=1", "input": "x"})
    assert response.status_code == 200
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


@pytest.mark.integration
def test_invalid_requests_get_provider_shaped_400s(up: FakeUpstream) -> None:
    chat = httpx.post(up.url + "/v1/chat/completions", content=b"not json")
    assert chat.status_code == 400 and chat.json()["error"]["type"] == "invalid_request_error"
    msg = httpx.post(up.url + "/v1/messages", json={"model": "c", "messages": HI})
    assert msg.status_code == 400 and msg.json()["type"] == "error"
    assert "max_tokens" in msg.json()["error"]["message"]
    resp = httpx.post(up.url + "/v1/responses", json={"model": "r", "input": 5})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input"
    unknown = httpx.post(
        up.url + "/v1/chat/completions",
        json={"model": "c", "messages": HI},
        headers={"x-fake-behaviour": "speed=3"},
    )
    assert unknown.status_code == 400 and "speed" in unknown.json()["error"]["message"]


@pytest.mark.integration
def test_control_endpoints(up: FakeUpstream, oai: openai.OpenAI) -> None:
    set_ = httpx.post(
        up.url + "/_control/behaviour", json={"model": "ctl", "text": "custom words", "chunks": 2}
    )
    assert set_.status_code == 200
    assert httpx.post(up.url + "/_control/behaviour", json={"model": "ctl", "nope": 1}).status_code == 400
    done = oai.chat.completions.create(
        model="ctl", messages=HI, extra_headers={"x-fake-behaviour": "tool=never"}
    )
    assert done.choices[0].message.content == "custom words"
    recorded = httpx.get(up.url + "/_control/requests").json()
    assert (
        recorded[-1]["body"]["model"] == "ctl" and recorded[-1]["headers"]["x-fake-behaviour"] == "tool=never"
    )
    assert httpx.delete(up.url + "/_control/requests").status_code == 200
    assert up.requests() == []
    models = httpx.get(up.url + "/v1/models").json()
    assert "ctl" in [m["id"] for m in models["data"]]


@pytest.mark.integration
def test_ttft_and_stall_delay_the_stream(oai: openai.OpenAI) -> None:
    start = time.perf_counter()
    stream = oai.chat.completions.create(
        model="slow@ttft_ms=200,stall_after=2,stall_ms=150", messages=HI, stream=True
    )
    arrivals = [time.perf_counter() - start for chunk in stream if chunk.choices[0].delta.content]
    assert arrivals[0] >= 0.18
    assert arrivals[2] - arrivals[1] >= 0.13 and arrivals[1] - arrivals[0] < 0.1


@pytest.mark.integration
def test_server_stops_without_leaking_threads() -> None:
    def running() -> int:
        return sum(t.name == "fake-upstream" for t in threading.enumerate())

    before = running()
    with FakeUpstream(default=Behaviour(text="plain"), per_model={"p": Behaviour(text="special")}) as server:
        assert running() == before + 1
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        texts = [
            client.chat.completions.create(model=m, messages=HI).choices[0].message.content for m in "op"
        ]
        assert texts == ["plain", "special"]
    assert running() == before
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/v1/models")


# -- litellm as a client ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm_module() -> Any:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # never fetch the price map from the network
    import litellm

    return litellm


@pytest.mark.integration
async def test_litellm_openai_stream(up: FakeUpstream, litellm_module: Any) -> None:
    stream = await litellm_module.acompletion(
        model="openai/small", api_base=up.url + "/v1", api_key="x", messages=HI, stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "Hello from small. This is a fake reply."


@pytest.mark.integration
async def test_litellm_anthropic_tool_call(up: FakeUpstream, litellm_module: Any) -> None:
    done = await litellm_module.acompletion(
        model="anthropic/claude-x", api_base=up.url, api_key="x", messages=HI, tools=CHAT_TOOLS
    )
    (call,) = done.choices[0].message.tool_calls
    assert call.function.name == "bash" and orjson.loads(call.function.arguments) == {"command": "ls"}
    assert done.choices[0].finish_reason == "tool_calls" and done.usage.prompt_tokens > 0
