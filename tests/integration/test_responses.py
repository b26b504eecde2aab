"""The OpenAI Responses API through the router: to a Chat Completions backend and to a Responses one."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

TOOL = {"type": "function", "name": "bash", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}  # fmt: skip


@pytest.fixture
def rrouter(router_factory, upstream: FakeUpstream) -> RunningRouter:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    policy["models"].append(
        {"id": "local-responses", "litellm_model": "openai/resp-model", "protocol": "openai_responses",
         "api_base": f"{upstream.url}/v1", "prices": {"input": 0.5, "output": 2.0}, "context_window": 128000,
         "max_output_tokens": 16000}
    )  # fmt: skip
    policy["routes"].insert(0, {"match": "resp", "passthrough": "local-responses"})
    upstream.clear()
    return router_factory(policy)  # type: ignore[no-any-return]


def client(r: RunningRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=r.url + "/v1", api_key="k", max_retries=0, timeout=30)


@pytest.mark.parametrize(
    ("model", "backend_path"), [("auto", "/v1/chat/completions"), ("resp", "/v1/responses")]
)
def test_tool_round_trip_streaming_and_not(
    rrouter: RunningRouter, upstream: FakeUpstream, model: str, backend_path: str
) -> None:
    c = client(rrouter)
    first = c.responses.create(model=model, input="list the files", tools=[TOOL], store=False)  # type: ignore[list-item]
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "bash" and json.loads(call.arguments) == {"command": "ls"}
    assert upstream.requests()[-1]["path"] == backend_path
    history: list[Any] = [
        {"role": "user", "content": "list the files"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "README.md"},
    ]
    events = list(c.responses.create(model=model, input=history, tools=[TOOL], stream=True, store=False))  # type: ignore[list-item]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    seq = [e.sequence_number for e in events]
    assert seq == sorted(seq)
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.usage is not None and completed.usage.output_tokens > 0
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert "README.md" in text
    rows = rrouter.records(2)
    assert {r["protocol"] for r in rows} == {"openai_responses"}
    streamed = rows[-1]
    for field in (
        "ttft_ms",
        "decode_ms",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "tools_sha256",
        "task_id",
    ):
        assert streamed[field] is not None, field


def test_reasoning_and_cache_key(rrouter: RunningRouter, upstream: FakeUpstream) -> None:
    c = client(rrouter)
    r = c.responses.create(model="resp", input="think", reasoning={"effort": "low"}, prompt_cache_key="sess-42",
                           store=False, include=["reasoning.encrypted_content"])  # fmt: skip
    assert r.output
    sent = upstream.requests()[-1]["body"]
    assert sent["prompt_cache_key"] == "sess-42" and sent["model"] == "resp-model"
    rec = rrouter.records(1)[-1]
    assert rec["task_id"] == "session-sess-42" and rec["reasoning_effort"] == "low"


def test_bad_responses_input(rrouter: RunningRouter) -> None:
    for body in (
        {"model": "auto"},
        {"model": "auto", "input": 7},
        {"model": "auto", "input": "x", "previous_response_id": "r1"},
    ):
        r = httpx.post(rrouter.url + "/v1/responses", json=body, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"], r.text
