"""Side calls (titles, summaries, compaction, quota checks): which requests count as one, for every shape
the system prompt takes — an OpenAI system message (string or parts), Anthropic's ``system`` (string
or block list) and the Responses API's ``instructions`` — read from the log of real requests.

A side call is tool-less and either names a side-call task in its system prompt (first 4000
characters) or its last message (last 4000), or asks for few output tokens (at most the policy's
``tasks.side_call_max_tokens``, 1024 by default) with a short history (at most two messages besides the system prompt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.fakeupstream import FakeUpstream
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from tests.unit.inprocess import PATHS, serving
from tests.unit.requestpath import model

#: System-prompt shapes: (client protocol, how the system text is carried).
SHAPES = {
    "chat-string": OPENAI_CHAT,
    "chat-parts": OPENAI_CHAT,
    "anthropic-string": ANTHROPIC,
    "anthropic-blocks": ANTHROPIC,
    "responses-instructions": OPENAI_RESPONSES,
}
BACKEND = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", OPENAI_RESPONSES: "openai_responses"}
PATTERNS = [
    "title", "Summary", "summarize", "summarise", "compact", "topic", "one-line", "one line",
    "commit message", "quota check",
]  # fmt: skip
NEUTRAL = "You are a careful coding agent. Fix the failing test in the repository."
BASH = {"name": "bash", "description": "run a shell command", "schema": {"type": "object", "properties": {}}}
#: A main-loop history: more than two messages.
LOOP = [
    {"role": "user", "content": "fix the bug"},
    {"role": "assistant", "content": "looking"},
    {"role": "user", "content": "go on"},
]


def body(
    shape: str,
    system: str | None,
    messages: list[dict[str, Any]],
    max_tokens: int | None,
    tools: bool = False,
) -> dict[str, Any]:
    protocol = SHAPES[shape]
    if protocol == OPENAI_CHAT:
        msgs = list(messages)
        if system is not None:
            content: Any = system if shape == "chat-string" else [{"type": "text", "text": system}]
            msgs.insert(0, {"role": "system", "content": content})
        out: dict[str, Any] = {"model": "auto", "messages": msgs}
        if max_tokens is not None:
            out["max_tokens"] = max_tokens
        if tools:
            out["tools"] = [
                {"type": "function", "function": {"name": BASH["name"], "parameters": BASH["schema"]}}
            ]
        return out
    if protocol == ANTHROPIC:
        # Anthropic requires max_tokens: "no limit" is a limit far above any side-call threshold.
        out = {"model": "auto", "messages": messages, "max_tokens": max_tokens or 32_000}
        if system is not None:
            out["system"] = system if shape == "anthropic-string" else [{"type": "text", "text": system}]
        if tools:
            out["tools"] = [{"name": BASH["name"], "input_schema": BASH["schema"]}]
        return out
    out = {"model": "auto", "input": messages}
    if system is not None:
        out["instructions"] = system
    if max_tokens is not None:
        out["max_output_tokens"] = max_tokens
    if tools:
        out["tools"] = [{"type": "function", "name": BASH["name"], "parameters": BASH["schema"]}]
    return out


async def side_calls(
    fake: FakeUpstream, tmp: Path, shape: str, cases: dict[str, dict[str, Any]], **policy: Any
) -> dict[str, bool]:
    """Send each case's body through the router; return whether each was logged as a side call."""
    protocol = SHAPES[shape]
    backend = model("a", fake.url, "text=ok", protocol=BACKEND[protocol])
    async with serving(tmp, [backend], policy=policy or None) as r:
        for name, sent in cases.items():
            # A task of its own per case: no pin or attempt carries over from one case to the next.
            answer = await r.client.post(PATHS[protocol], json=sent, headers={"x-router-task-id": name})
            assert answer.status_code == 200, (name, answer.text)
        rows = await r.records()
    assert len(rows) == len(cases)
    return {name: bool(row.side_call) for name, row in zip(cases, rows, strict=True)}


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_each_pattern_in_the_system_prompt(fake: FakeUpstream, tmp_path: Path, shape: str) -> None:
    cases = {
        f"system says {p!r}": body(shape, f"{NEUTRAL} Then write a {p} for it.", LOOP, None) for p in PATTERNS
    }
    cases["neutral system"] = body(shape, NEUTRAL, LOOP, None)
    # Word boundaries: a pattern inside a longer word is not the pattern.
    cases["subtitles and topical"] = body(
        shape, NEUTRAL + " Check the subtitles, topical and compacted.", LOOP, None
    )
    cases["pattern past 4000 chars"] = body(shape, NEUTRAL + " " * 4000 + "Write a title.", LOOP, None)
    cases["pattern with tools"] = body(shape, "Write a title for this.", LOOP, None, tools=True)
    expected = {name: name.startswith("system says") for name in cases}
    assert await side_calls(fake, tmp_path, shape, cases) == expected


@pytest.mark.parametrize("shape", ["chat-string", "anthropic-string", "responses-instructions"])
async def test_each_pattern_in_the_last_message(fake: FakeUpstream, tmp_path: Path, shape: str) -> None:
    def ending(text: str) -> list[dict[str, Any]]:
        return [*LOOP[:-1], {"role": "user", "content": text}]

    cases = {f"last says {p!r}": body(shape, NEUTRAL, ending(f"Now a {p}, please."), None) for p in PATTERNS}
    cases["earlier message only"] = body(
        shape, NEUTRAL, [{"role": "user", "content": "a title"}, *LOOP[1:]], None
    )
    cases["pattern before the last 4000 chars"] = body(shape, NEUTRAL, ending("a title" + "." * 4000), None)
    expected = {name: name.startswith("last says") for name in cases}
    assert await side_calls(fake, tmp_path, shape, cases) == expected


@pytest.mark.parametrize("shape", ["chat-string", "anthropic-string", "responses-instructions"])
async def test_token_boundary_and_message_count(fake: FakeUpstream, tmp_path: Path, shape: str) -> None:
    """Issue 23's second surviving fault: the 1024-token threshold changed eightfold went unnoticed."""
    one = LOOP[:1]
    two = LOOP[:2]
    cases = {
        "1024 tokens, one message": body(shape, None, one, 1024),
        "1025 tokens, one message": body(shape, None, one, 1025),
        "128 tokens, two messages": body(shape, None, two, 128),
        "128 tokens, three messages": body(shape, None, LOOP, 128),
        # A system prompt is not part of the history, whichever way the protocol carries it.
        "128 tokens, two messages and a system prompt": body(shape, NEUTRAL, two, 128),
        "no limit, one message": body(shape, None, one, None),
        "8 tokens with tools": body(shape, None, one, 8, tools=True),
    }
    expected = {
        "1024 tokens, one message": True,
        "1025 tokens, one message": False,
        "128 tokens, two messages": True,
        "128 tokens, three messages": False,
        "128 tokens, two messages and a system prompt": True,
        "no limit, one message": False,
        "8 tokens with tools": False,
    }
    assert await side_calls(fake, tmp_path, shape, cases) == expected


async def test_the_policy_sets_the_token_threshold(fake: FakeUpstream, tmp_path: Path) -> None:
    cases = {
        "256": body("chat-string", None, LOOP[:1], 256),
        "257": body("chat-string", None, LOOP[:1], 257),
    }
    tasks = {"tasks": {"side_call_max_tokens": 256}}
    assert await side_calls(fake, tmp_path, "chat-string", cases, **tasks) == {"256": True, "257": False}


async def test_side_calls_go_to_the_cheapest_and_leave_the_pin(fake: FakeUpstream, tmp_path: Path) -> None:
    cheap = {**model("cheap", fake.url), "prices": {"input": 0.1, "output": 0.2}}
    async with serving(tmp_path, [model("main", fake.url), cheap], policy={"rules": [
        {"name": "main-loop", "when": {"side_call": False}, "prefer": ["main"]},
    ]}) as r:  # fmt: skip
        task = {"x-router-task-id": "one-task"}
        await r.client.post(PATHS[OPENAI_CHAT], json=body("chat-string", NEUTRAL, LOOP, None), headers=task)
        await r.client.post(
            PATHS[OPENAI_CHAT], json=body("chat-string", "Write a title.", LOOP, None), headers=task
        )
        await r.client.post(PATHS[OPENAI_CHAT], json=body("chat-string", NEUTRAL, LOOP, None), headers=task)
        rows = await r.records()
    assert [(row.side_call, row.chosen_model) for row in rows] == [
        (False, "main"), (True, "cheap"), (False, "main")
    ]  # fmt: skip
