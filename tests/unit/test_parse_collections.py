"""A large body is parsed without the cyclic garbage collector running meanwhile.

Parsing makes an object of every JSON value, and the collector, run every few hundred new
objects, went over the body again and again as it grew (the server freezes what it loaded at
its start, so the body was most of what a full collection walks): a 17.7 MB body of 200,000 tool
definitions took 4.9 s to parse, 1.6 s with the collector paused, all of it on the event loop that
every other client waits on (found by the hostile probe: ``/healthz`` waited 6.3 s)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from router.errors import BadRequest
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, WIRES
from router.protocols.common import MAX_TOOLS
from router.protocols.pausedgc import PAUSED_FROM_BYTES, collector_paused

TOOLS = MAX_TOOLS
#: Each tool's description: the bodies are then well over ``PAUSED_FROM_BYTES``.
ABOUT = "Reads one file of the repository and returns its text."


def _bodies(tools: int = TOOLS) -> dict[str, dict[str, Any]]:
    return {
        OPENAI_CHAT: {
            "model": "auto", "messages": [{"role": "user", "content": "a"}],
            "tools": [{"type": "function", "function": {"name": f"t{i}", "description": ABOUT,
                                                        "parameters": {"type": "object"}}} for i in range(tools)],
        },
        ANTHROPIC: {
            "model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "a"}],
            "tools": [{"name": f"t{i}", "description": ABOUT, "input_schema": {"type": "object"}}
                      for i in range(tools)],
        },
        OPENAI_RESPONSES: {
            "model": "auto", "input": "a",
            "tools": [{"type": "function", "name": f"t{i}", "description": ABOUT, "parameters": {"type": "object"}}
                      for i in range(tools)],
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
    assert len(raw) >= PAUSED_FROM_BYTES
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


@pytest.mark.parametrize("protocol", [OPENAI_CHAT, ANTHROPIC, OPENAI_RESPONSES])
def test_more_tools_than_any_client_sends_are_a_400(protocol: str) -> None:
    """120,000 tools (20 MB) held the thread that parses large bodies, and with it the event loop,
    for a second in one call of pydantic's; OpenAI itself refuses more than 128."""
    raw = orjson.dumps(_bodies(MAX_TOOLS + 1)[protocol])
    with pytest.raises(BadRequest, match=f"tools: at most {MAX_TOOLS} tools, got {MAX_TOOLS + 1}") as err:
        WIRES[protocol].parse(raw)
    assert err.value.param == "tools"
    assert gc.isenabled()


def test_the_collector_stays_paused_until_the_last_of_two_overlapping_parses_ends() -> None:
    """A body under 1 MiB is parsed on the event loop, a larger one on a thread of its own: the first
    to end turned the collector back on under the other, which then ran with it on."""
    inside, release = threading.Event(), threading.Event()
    body = b"x" * PAUSED_FROM_BYTES

    @collector_paused
    def slow(raw: bytes) -> bool:
        inside.set()
        assert release.wait(10)
        return gc.isenabled()

    with ThreadPoolExecutor(1) as pool:

        @collector_paused
        def quick(raw: bytes) -> Any:
            started = pool.submit(slow, raw)
            assert inside.wait(10)
            return started

        still = quick(body)  # ends while ``slow`` is still parsing
        assert not gc.isenabled()
        release.set()
        assert still.result(10) is False
    assert gc.isenabled()
