"""Request bodies: small chat turns, and coding-agent conversations of a chosen size.

The load generator must not be the bottleneck, yet every request should be distinct (a proxy
that caches per message or spots resent requests must see real traffic). So a body is serialized
once around two placeholders, the task and the request number, and each request only splices
two numbers in (``Template.render``).

Agent conversations look like a coding agent's: a long system prompt, tool definitions, the task,
then assistant tool calls answered by tool results (source files, test runs). They are generated
deterministically from a seed, so runs are comparable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

TASK = "__TASK__"
REQUEST = "__REQUEST__"

_WORDS = (
    "parser", "token", "buffer", "config", "request", "handler", "cache", "index", "value", "result",
    "error", "state", "module", "client", "server", "stream", "record", "field", "schema", "policy",
    "backend", "route", "model", "prompt", "budget", "retry",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Template:
    """A serialized body with a task slot and a request slot (in that order)."""

    head: bytes
    middle: bytes
    tail: bytes

    def render(self, task: int, request: int) -> bytes:
        return b"".join((self.head, str(task).encode(), self.middle, str(request).encode(), self.tail))


def template(body: dict[str, Any]) -> Template:
    raw = orjson.dumps(body)
    task, request = TASK.encode(), REQUEST.encode()
    if raw.count(task) != 1 or raw.count(request) != 1 or raw.index(task) > raw.index(request):
        raise ValueError("a body template needs one task placeholder followed by one request placeholder")
    head, rest = raw.split(task)
    middle, tail = rest.split(request)
    return Template(head, middle, tail)


def chat_body(model: str, stream: bool) -> dict[str, Any]:
    """A short OpenAI Chat turn of an ongoing task (not a side call: four messages, no limit)."""
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a careful coding assistant."},
            {"role": "user", "content": f"Task {TASK}: explain what the function below does."},
            {"role": "assistant", "content": "Sure, please paste the function."},
            {"role": "user", "content": f"def add(a, b):\n    return a + b  # request {REQUEST}"},
        ],
        "stream": stream,
    }


def anthropic_body(model: str, stream: bool) -> dict[str, Any]:
    """A short Anthropic Messages turn of an ongoing task."""
    return {
        "model": model,
        "max_tokens": 512,
        "system": "You are a careful coding assistant.",
        "messages": [
            {"role": "user", "content": f"Task {TASK}: explain what the function below does."},
            {"role": "assistant", "content": "Sure, please paste the function."},
            {"role": "user", "content": f"def add(a, b):\n    return a + b  # request {REQUEST}"},
        ],
        "stream": stream,
    }


def agent_chat_body(model: str, stream: bool, n_messages: int = 40, size: int = 200_000) -> dict[str, Any]:
    """An OpenAI Chat request of a coding agent deep in its task: ``n_messages`` messages, ``size`` bytes."""
    messages, tools = agent_conversation(n_messages, size, seed=1, task=TASK)
    messages[-1]["content"] += f"\n# request {REQUEST}\n"
    return {"model": model, "messages": messages, "tools": tools, "stream": stream}


def tool_definitions() -> list[dict[str, Any]]:
    def tool(name: str, description: str, **props: str) -> dict[str, Any]:
        properties = {
            p: {"type": kind, "description": f"The {p.replace('_', ' ')}."} for p, kind in props.items()
        }
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": properties, "required": list(props)},
            },
        }

    return [
        tool("read_file", "Read a file of the repository.", path="string", start_line="integer"),
        tool("run_tests", "Run the test suite, or some of it.", selector="string", timeout_s="integer"),
        tool("search_code", "Search the repository for a regular expression.", pattern="string"),
        tool("edit_file", "Replace text in a file.", path="string", old="string", new="string"),
        tool("list_dir", "List a directory.", path="string"),
    ]


def agent_conversation(
    n_messages: int, size: int, *, seed: int = 1, task: str = "0"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Messages (system, task, then tool call / tool result pairs) of about ``size`` bytes, and tools."""
    if n_messages < 4 or n_messages % 2:
        raise ValueError("n_messages must be even and at least 4")
    rng = random.Random(seed)
    system_size = min(8_000, size // 10)
    pairs = (n_messages - 2) // 2
    result_size = max(200, (size - system_size - 400) // pairs - 150)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _prose(rng, system_size)},
        {"role": "user", "content": f"Task {task}: the parser drops the last token of a stream; fix it."},
    ]
    for i in range(pairs):
        messages.extend(tool_turn(rng, i, result_size))
    return messages, tool_definitions()


def tool_turn(rng: random.Random, i: int, size: int) -> list[dict[str, Any]]:
    """One assistant tool call and its result: a source file, or a test run every fourth turn."""
    call_id = f"call_{i:06d}_{rng.randrange(10**6):06d}"
    if i % 4 == 3:
        name, args, result = (
            "run_tests",
            {"selector": f"tests/test_mod{i}.py", "timeout_s": 60},
            _pytest(rng, size),
        )
    else:
        path = f"src/pkg/module_{i}.py"
        name, args, result = "read_file", {"path": path, "start_line": 1}, _source(rng, size)
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def _prose(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 14))).capitalize() + ". "
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:size]


def _source(rng: random.Random, size: int) -> str:
    lines: list[str] = []
    n = 0
    while n < size:
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        k = rng.randrange(1000)
        block = (
            f"def {a}_{b}_{k}({a}: int, {b}: str | None = None) -> dict[str, int]:\n"
            f'    """Return the {a} of {b} ({k})."""\n'
            f"    if {b} is None:\n"
            f"        raise ValueError('{b} missing for {a}')\n"
            f"    return {{'{a}': {a} * {k} + len({b}), 'size': {rng.randrange(1 << 16)}}}\n\n"
        )
        lines.append(block)
        n += len(block)
    return "".join(lines)[:size]


def _pytest(rng: random.Random, size: int) -> str:
    failed, passed = rng.randint(1, 4), rng.randint(10, 60)
    head = "============================= test session starts ==============================\n"
    body = _source(rng, max(0, size - 300))
    tail = (
        "\nE       AssertionError: assert 41 == 42\n"
        f"=========================== short test summary info ============================\n"
        f"FAILED tests/test_parser.py::test_last_token - AssertionError\n"
        f"======================== {failed} failed, {passed} passed in 0.{rng.randrange(10, 99)}s ========================\n"
    )
    return head + body + tail
