"""The openai SDK through the router (real uvicorn) to the local upstream."""

from __future__ import annotations

import json

import openai
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def client(router: RunningRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0, timeout=20)


def test_non_streaming_routes_to_cheapest_and_says_so(router: RunningRouter) -> None:
    raw = client(router).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hello"}], temperature=0.2, seed=7
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert raw.headers["x-router-model"] == "local-nano"
    assert raw.headers["x-router-decision-id"]
    assert raw.headers["x-router-task-id"]
    assert completion.usage is not None and completion.usage.prompt_tokens > 0


def test_streaming_tool_round_trip(router: RunningRouter, upstream: FakeUpstream) -> None:
    c = client(router)
    messages: list = [{"role": "user", "content": "list files"}]
    stream = c.chat.completions.create(
        model="auto", messages=messages, tools=[BASH], stream=True, stream_options={"include_usage": True}
    )
    calls: dict[int, dict] = {}
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                entry["id"] = tc.id or entry["id"]
                entry["name"] += tc.function.name or "" if tc.function else ""
                entry["args"] += tc.function.arguments or "" if tc.function else ""
    assert usage is not None and usage.completion_tokens > 0
    call = calls[0]
    assert call["name"] == "bash"
    assert json.loads(call["args"]) == {"command": "ls"}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": "bash", "arguments": call["args"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "README.md\nsetup.py"},
    ]  # fmt: skip
    reply = c.chat.completions.create(model="auto", messages=messages, tools=[BASH])
    assert "README.md" in (reply.choices[0].message.content or "")
    forwarded = [r for r in upstream.requests() if r["path"].endswith("/chat/completions")][-1]
    assert forwarded["body"]["model"] == "nano-model"
    assert forwarded["body"]["messages"][-1]["role"] == "tool"


def test_streaming_without_include_usage_hides_usage_chunk_but_logs_usage(router: RunningRouter) -> None:
    chunks = list(client(router).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], stream=True
    ))  # fmt: skip
    assert chunks and all(ch.choices for ch in chunks)
    rec = router.records(1)[-1]
    assert rec["output_tokens"] and rec["input_tokens"] and not rec["usage_estimated"]


def test_unknown_fields_never_reach_the_provider(router: RunningRouter, upstream: FakeUpstream) -> None:
    client(router).chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={
            "api_base": "http://127.0.0.1:1/steal",
            "base_url": "http://evil",
            "extra_headers": {"x": "y"},
        },
        extra_headers={"x-api-key": "client-secret"},
    )
    sent = upstream.requests()[-1]
    for field in ("api_base", "base_url", "extra_headers"):
        assert field not in sent["body"]
    assert "client-secret" not in json.dumps(sent)


def test_large_prompt_skips_small_window(router: RunningRouter) -> None:
    big = "def f(x):\n    return x * 2\n" * 6000  # ~40k tokens; local-nano holds 16k
    raw = client(router).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": big}]
    )
    assert raw.headers["x-router-model"] == "local-mini"


def test_fallback_on_429_and_500(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    models = {m["id"]: m for m in policy["models"]}
    models["local-nano"]["litellm_model"] = "openai/nano-model@status=429,retry_after=1"
    models["local-mini"]["litellm_model"] = "openai/mini-model@status=500"
    r = router_factory(policy)
    raw = client(r).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-router-model"] == "local-large"
    rec = r.records(1)[-1]
    tries = json.loads(rec["tries"])
    assert [t["model"] for t in tries] == ["local-nano", "local-mini", "local-large"]
    assert [t["status"] for t in tries] == [429, 500, 200]  # what each backend answered


def test_streaming_fallback_before_first_token(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@status=500"
    r = router_factory(policy)
    stream = client(r).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert stream.headers["x-router-model"] == "local-mini"
    text = "".join(ch.choices[0].delta.content or "" for ch in stream.parse() if ch.choices)
    assert "mini-model" in text


def test_stream_broken_after_first_token_ends_with_one_error(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@break_after=3,chunks=10"
    r = router_factory(policy)
    with pytest.raises(openai.APIError):
        for _ in client(r).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass
    rec = r.records(1)[-1]
    assert rec["error_type"] == "UpstreamError"
    assert rec["chosen_model"] == "local-nano"
    assert rec["output_tokens"] is not None  # partial usage is logged (estimated)
