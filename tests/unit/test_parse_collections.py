"""A large body is parsed without the cyclic garbage collector running meanwhile.

Parsing makes an object of every JSON value, and the collector, run every few hundred new
objects, went over the body again and again as it grew (the server freezes what it loaded at
its start, so the body was most of what a full collection walks): a 17.7 MB body of 200,000 tool
definitions took 4.9 s to parse, 1.6 s with the collector paused, all of it on the event loop that
every other client waits on (found by the hostile probe: ``/healthz`` waited 6.3 s)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, WIRES

TOOLS = 20_000


def _bodies() -> dict[str, dict[str, Any]]:
    return {
        OPENAI_CHAT: {
            "model": "auto", "messages": [{"role": "user", "content": "a"}],
            "tools": [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
                      for i in range(TOOLS)],
        },
        ANTHROPIC: {
            "model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "a"}],
            "tools": [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(TOOLS)],
        },
        OPENAI_RESPONSES: {
            "model": "auto", "input": "a",
            "tools": [{"type": "function", "name": f"t{i}", "parameters": {"type": "object"}} for i in range(TOOLS)],
        },
    }  # fmt: skip


@pytest.fixture
def collections() -> Iterator[list[int]]:
    runs: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(seen)
    yield runs
    gc.callbacks.remove(seen)


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
def test_a_large_body_is_parsed_without_a_collection(protocol: str, collections: list[int]) -> None:
    raw = orjson.dumps(_bodies()[protocol])
    assert gc.isenabled()
    collections.clear()  # the test's own making of the body
    req = WIRES[protocol].parse(raw)
    assert len(req.tools) == TOOLS
    assert collections == []
    assert gc.isenabled()  # paused for the parse only


def test_a_refused_large_body_turns_the_collector_back_on(collections: list[int]) -> None:
    body = _bodies()[OPENAI_CHAT]
    body["tools"][-1]["function"]["name"] = ""
    with pytest.raises(Exception, match="name"):
        WIRES[OPENAI_CHAT].parse(orjson.dumps(body))
    assert gc.isenabled()
