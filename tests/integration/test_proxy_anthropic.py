"""The anthropic SDK through the router (real uvicorn) to the local upstream."""

from __future__ import annotations

import anthropic
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

BASH = {
    "name": "bash",
    "description": "Run a command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
THINKING = {"type": "enabled", "budget_tokens": 1024}


def client(router: RunningRouter, **kw) -> anthropic.Anthropic:  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=router.url, api_key="sk-ant-test", max_retries=0, timeout=20, **kw)


def test_thinking_stream_relays_full_event_sequence(router: RunningRouter, upstream: FakeUpstream) -> None:
    system = [{"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}}]
    with client(router).messages.stream(
        model="claude-sonnet-4-6", max_tokens=2048, thinking=THINKING, system=system,
        messages=[{"role": "user", "content": "plan"}],
    ) as stream:  # fmt: skip
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    thinking = [b for b in final.content if b.type == "thinking"]
    assert thinking and thinking[0].signature
    sent = upstream.requests()[-1]
    assert sent["path"].startswith("/v1/messages")
    assert sent["body"]["model"] == "claude-local"
    assert sent["body"]["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert sent["body"]["thinking"] == THINKING


def test_thinking_signature_round_trips_unchanged(router: RunningRouter, upstream: FakeUpstream) -> None:
    c = client(router)
    first = c.messages.create(
        model="claude-sonnet-4-6", max_tokens=2048, thinking=THINKING, tools=[BASH],
        messages=[{"role": "user", "content": "run ls"}],
    )  # fmt: skip
    tool_use = next(b for b in first.content if b.type == "tool_use")
    history = [
        {"role": "user", "content": "run ls"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "a.py"}]},
    ]
    second = c.messages.create(
        model="claude-sonnet-4-6", max_tokens=2048, thinking=THINKING, tools=[BASH], messages=history
    )
    assert any(b.type == "text" for b in second.content)
    sent = upstream.requests()[-1]["body"]["messages"][1]["content"]
    sig = next(b.signature for b in first.content if b.type == "thinking")
    assert next(b for b in sent if b["type"] == "thinking")["signature"] == sig


def test_count_tokens(router: RunningRouter) -> None:
    n = client(router).messages.count_tokens(
        model="claude-sonnet-4-6", messages=[{"role": "user", "content": "hello world " * 100}]
    )
    assert 150 < n.input_tokens < 400


def test_beta_query_and_claude_code_fields(router: RunningRouter, upstream: FakeUpstream) -> None:
    # What Claude Code sends: ?beta=true, betas, metadata.user_id with a session, context_management.
    r = client(router).beta.messages.create(
        model="claude-sonnet-4-6", max_tokens=1024, thinking=THINKING,
        betas=["context-management-2025-06-27"],
        metadata={"user_id": "user_abc_account_123_session_5f1c2b9e-1111-2222-3333-444455556666"},
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"context_management": {"edits": []}},
    )  # fmt: skip
    assert r.content
    sent = upstream.requests()[-1]
    assert sent["headers"].get("anthropic-beta") == "context-management-2025-06-27"
    assert sent["body"]["context_management"] == {"edits": []}
    rec = router.records(1)[-1]
    assert rec["task_id"] == "session-5f1c2b9e-1111-2222-3333-444455556666"


def test_anthropic_client_to_openai_backend_with_tools_streaming(
    router: RunningRouter, upstream: FakeUpstream
) -> None:
    # No thinking: the cheapest candidate is an OpenAI-protocol model, reached through litellm.
    c = client(router)
    with c.messages.stream(
        model="claude-haiku-4-5",
        max_tokens=1024,
        tools=[BASH],
        messages=[{"role": "user", "content": "run ls"}],
    ) as stream:
        final = stream.get_final_message()
    tool_use = next(b for b in final.content if b.type == "tool_use")
    assert tool_use.name == "bash" and tool_use.input == {"command": "ls"}
    assert final.stop_reason == "tool_use"
    sent = upstream.requests()[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "nano-model"
    history = [
        {"role": "user", "content": "run ls"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "a.py"}]},
    ]
    reply = c.messages.create(model="claude-haiku-4-5", max_tokens=1024, tools=[BASH], messages=history)
    assert "a.py" in next(b.text for b in reply.content if b.type == "text")
    rec = router.records(2)[-1]
    assert rec["chosen_model"] == "local-nano" and rec["protocol"] == "anthropic"
    assert rec["input_tokens"] and rec["output_tokens"] and rec["cost_usd"] > 0


def test_openai_client_to_anthropic_backend(router: RunningRouter, upstream: FakeUpstream) -> None:
    import openai

    c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=20)
    chunks = list(c.chat.completions.create(
        model="local-claude", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "claude-local" in text
    assert chunks[-1].usage is not None
    assert upstream.requests()[-1]["path"].startswith("/v1/messages")
