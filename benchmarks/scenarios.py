"""What the load benchmark sends: one scenario per row group, one model name per target.

The fake upstream runs with 20 chunks per streamed reply. The router runs the demo policy
(``policies/examples/local.yaml``): ``auto`` goes to the cheapest OpenAI-protocol backend (a raw
relay), ``local-claude`` pins the Anthropic backend (a raw relay), and a ``claude-*`` name is routed
to the cheapest backend, an OpenAI one, so the Anthropic client's request is translated through
litellm — the cross-protocol cost, measured on its own row group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from benchmarks import bodies, replay
from benchmarks.loadgen import ANTHROPIC_CONTENT, OPENAI_CONTENT, Call
from benchmarks.report import LITELLM, PASSTHROUGH, ROUTER, UPSTREAM

CHUNKS = 20
#: With tools offered, the fake upstream may answer with a tool call: its arguments are the content.
OPENAI_CONTENT_OR_CALL = re.compile(OPENAI_CONTENT.pattern + rb'|"arguments":\s?"[^"]')
OPENAI_HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}
ANTHROPIC_HEADERS = {
    "content-type": "application/json",
    "x-api-key": "bench",
    "anthropic-version": "2023-06-01",
}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    anthropic: bool
    stream: bool
    #: The model each target is asked for.
    models: Mapping[str, str]
    agent: bool = False
    #: Concurrency levels for this scenario when not the run's own (agent-sized and translated rows).
    concurrency: tuple[int, ...] | None = None
    #: Real agent runs replayed turn by turn (``benchmarks.replay``) instead of a synthetic body.
    replay: bool = False


# The pass-through forwards bodies unchanged, so it asks for the upstream's own model names; it
# cannot translate, so the cross-protocol scenario has no pass-through row.
_SMALL = {UPSTREAM: "nano-model", PASSTHROUGH: "nano-model", ROUTER: "auto", LITELLM: "auto"}
_CLAUDE = {
    UPSTREAM: "claude-local",
    PASSTHROUGH: "claude-local",
    ROUTER: "local-claude",
    LITELLM: "local-claude",
}

_MINI = {UPSTREAM: "mini-model", PASSTHROUGH: "mini-model", ROUTER: "auto", LITELLM: "auto"}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "replay", "Real agent runs replayed turn by turn: OpenAI Chat, bash tool calls, streamed",
            False, True, _MINI, replay=True,
        ),
        Scenario(
            "replay-anthropic", "The same runs as Claude Code sends them: Anthropic tool_use/tool_result, "
            "streamed, relayed", True, True, _CLAUDE, replay=True, concurrency=(1, 16),
        ),
        Scenario("chat", "OpenAI Chat, not streamed", anthropic=False, stream=False, models=_SMALL),
        Scenario("chat-stream", f"OpenAI Chat, streamed ({CHUNKS} chunks)", False, True, _SMALL),
        Scenario("anthropic-stream", f"Anthropic Messages, streamed ({CHUNKS} chunks), relayed", True, True, _CLAUDE),
        Scenario(
            "agent-stream", "OpenAI Chat, streamed, 40 messages / ~200 KB (a coding agent's turn)",
            False, True, _MINI, agent=True,
            concurrency=(1, 16),
        ),
        Scenario(
            "translated-stream", "Anthropic client → OpenAI backend, streamed (litellm translates)",
            True, True, {UPSTREAM: "claude-local", ROUTER: "claude-sonnet-4-5", LITELLM: "claude-sonnet-4-5"},
            concurrency=(1, 16),
        ),
    )
}  # fmt: skip


def call(scenario: Scenario, target: str) -> Call:
    model = scenario.models[target]
    if scenario.replay:
        played = replay.Replay(replay.load(), model, scenario.stream, scenario.anthropic)
        return Call(
            path="/v1/messages" if scenario.anthropic else "/v1/chat/completions",
            headers=ANTHROPIC_HEADERS if scenario.anthropic else OPENAI_HEADERS,
            body=played,
            stream=scenario.stream,
            content=ANTHROPIC_CONTENT if scenario.anthropic else OPENAI_CONTENT_OR_CALL,
            end=b"message_stop" if scenario.anthropic else b"[DONE]",
        )
    if scenario.agent:
        body = bodies.agent_chat_body(model, scenario.stream)
    elif scenario.anthropic:
        body = bodies.anthropic_body(model, scenario.stream)
    else:
        body = bodies.chat_body(model, scenario.stream)
    return Call(
        path="/v1/messages" if scenario.anthropic else "/v1/chat/completions",
        headers=ANTHROPIC_HEADERS if scenario.anthropic else OPENAI_HEADERS,
        body=bodies.template(body),
        stream=scenario.stream,
        content=(ANTHROPIC_CONTENT if scenario.anthropic else OPENAI_CONTENT) if scenario.stream else None,
        end=b"message_stop" if scenario.anthropic else b"[DONE]",
        tasks=16 if scenario.agent else 64,
    )
