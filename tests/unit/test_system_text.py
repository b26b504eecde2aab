"""The system prompt read as text once, at parse time, whatever its protocol's shape."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.features.task.context import vector_for
from router.features.task.tracker import is_side_call
from router.protocols import WIRES, ClientRequest

TITLE = "Generate a one-line title for this conversation."
USER = [{"role": "user", "content": "fix the failing test in parser.py"}]

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic string": ("anthropic", {"system": TITLE, "messages": USER, "max_tokens": 4096}),
    "anthropic blocks": (
        "anthropic",
        {
            "system": [{"type": "text", "text": TITLE, "cache_control": {"type": "ephemeral"}}],
            "messages": USER,
            "max_tokens": 4096,
        },
    ),
    "chat system message": ("openai_chat", {"messages": [{"role": "system", "content": TITLE}, *USER]}),
    "chat developer parts": (
        "openai_chat",
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": TITLE}]}, *USER]},
    ),
    "responses instructions": ("openai_responses", {"instructions": TITLE, "input": USER}),
}


def parsed(shape: str) -> ClientRequest:
    protocol, body = SHAPES[shape]
    return WIRES[protocol].parse(orjson.dumps({"model": "m", **body}))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_system_text_is_read_in_every_shape(shape: str) -> None:
    req = parsed(shape)
    assert req.system_text == TITLE
    # A title request beside the agent's loop is a side call whatever the shape (Anthropic's block
    # list once read as '' and was routed as a main-loop request).
    assert is_side_call(req)
    assert vector_for(req) == vector_for(parsed("anthropic string"))
