"""Every request leaves one complete log record, without prompt text."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from router.fakeupstream import FakeUpstream
from router.http.flight import MAX_LOGGED_CHARS
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

MARKER = "PROMPT-MARKER-7f3a9c"
SYSTEM = f"You are a careful coder. {MARKER}"
TOOLS = [{
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
}]  # fmt: skip


def test_streamed_openai_request_fills_every_field(router: RunningRouter) -> None:
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-x", max_retries=0, timeout=20)
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"fix the bug {MARKER}"}]
    list(c.chat.completions.create(model="auto", messages=history, max_tokens=50, tool_choice="none",
                                   tools=TOOLS, temperature=0.3, top_p=0.9, stream=True))  # fmt: skip
    # The second turn repeats the first turn's prefix: the provider reports it as cached.
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and now?"}]
    list(c.chat.completions.create(model="auto", messages=history, max_tokens=50, tools=TOOLS,
                                   temperature=0.3, top_p=0.9, stream=True, reasoning_effort="low"))  # fmt: skip
    rec = router.records(2)[-1]
    must_be_set = [
        "request_id", "ts", "decision_id", "task_id", "protocol", "endpoint", "requested_model",
        "chosen_model", "backend_model", "provider_model", "response_id", "finish_reasons", "policy",
        "decision_reason", "propensity",
        "candidates", "tries", "status", "input_tokens", "output_tokens", "cache_read_tokens",
        "reasoning_tokens", "prompt_tokens_est", "cost_usd", "cost_est_usd", "queue_ms", "ttft_ms",
        "decode_ms", "gap_mean_ms", "gap_p95_ms", "gap_max_ms", "delivery_ms", "total_ms", "temperature",
        "top_p", "max_tokens", "reasoning_effort", "tools_sha256", "system_sha256", "n_messages", "n_tools",
    ]  # fmt: skip
    missing = [f for f in must_be_set if rec[f] is None]
    assert not missing, missing
    assert rec["stream"] == 1 and rec["status"] == 200 and rec["usage_estimated"] == 0
    assert rec["protocol"] == "openai_chat" and rec["requested_model"] == "auto"
    assert rec["cache_read_tokens"] > 0 and rec["reasoning_tokens"] > 0
    assert rec["temperature"] == 0.3 and rec["max_tokens"] == 50 and rec["reasoning_effort"] == "low"
    assert rec["tools_sha256"] == hashlib.sha256(orjson.dumps(TOOLS, option=orjson.OPT_SORT_KEYS)).hexdigest()
    candidates = json.loads(rec["candidates"])
    assert {c["model"] for c in candidates} == {"local-nano", "local-mini", "local-large", "local-claude"}
    assert all("cost_usd" in c and "prompt_tokens" in c for c in candidates)
    assert rec["total_ms"] >= rec["queue_ms"] and rec["ttft_ms"] >= 0
    first = router.records(2)[0]
    assert first["task_id"] == rec["task_id"], "a growing conversation stays one task"
    assert MARKER not in json.dumps(router.records(2))
    assert MARKER.encode() not in router.db_path.read_bytes()


def test_anthropic_cache_write_and_thinking_budget_logged(router: RunningRouter) -> None:
    c = anthropic.Anthropic(base_url=router.url, api_key="sk-ant-x", max_retries=0, timeout=20)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    with c.messages.stream(model="claude-sonnet-4-6", max_tokens=4096, system=system,
                           thinking={"type": "enabled", "budget_tokens": 2048},
                           messages=[{"role": "user", "content": "hi"}]) as s:  # fmt: skip
        s.get_final_message()
    rec = router.records(1)[-1]
    assert rec["chosen_model"] == "local-claude"
    assert rec["cache_write_tokens"] and rec["cache_write_tokens"] > 0
    assert rec["thinking_budget"] == 2048 and rec["ttft_ms"] is not None
    assert rec["input_tokens"] >= rec["cache_write_tokens"]


def test_non_streaming_ttft_is_absent_not_guessed(router: RunningRouter) -> None:
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="sk-x", max_retries=0, timeout=20)
    c.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
    rec = router.records(1)[-1]
    assert rec["ttft_ms"] is None and rec["decode_ms"] is None
    assert rec["total_ms"] > 0 and rec["queue_ms"] is not None and rec["delivery_ms"] is not None


def test_client_strings_are_capped_in_the_log(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """A 1 MiB reasoning_effort made a 1.77 MB row, a 60 KiB header a 127 KB row (issue 30): each
    string a client chose is kept to its first MAX_LOGGED_CHARS characters, marked as cut."""
    r = router_factory(local_policy(upstream.url))  # its rules read x-router-tier: the log keeps it
    plain = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(r.url + "/v1/chat/completions", json=plain, timeout=20).status_code == 200
    huge = {**plain, "reasoning_effort": "x" * (1 << 20)}
    headers = {
        "x-router-repo": "acme/" + "r" * 20_000,
        "x-router-team": "t" * 20_000,
        "x-router-tier": "p" * 20_000,
    }
    for body, h in ((huge, {}), (plain, headers)):
        resp = httpx.post(r.url + "/v1/chat/completions", json=body, headers=h, timeout=20)
        assert resp.status_code in (200, 400), resp.text
    rows = r.records(3)
    assert len(rows) == 3

    def size(row: dict[str, Any]) -> int:
        return sum(len(str(v)) for v in row.values() if v is not None)

    normal = size(rows[0])
    for row in rows[1:]:
        assert size(row) <= normal + 4 * MAX_LOGGED_CHARS, {
            k: len(str(v)) for k, v in row.items() if len(str(v)) > 300
        }
    effort = rows[1]["reasoning_effort"]
    assert effort is None or (len(effort) <= MAX_LOGGED_CHARS + 1 and effort.endswith("…"))
