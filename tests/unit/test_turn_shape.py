"""``turn_shape`` on real agent turns: what the output's turn cell is made of, in every protocol's shape.

The shipped trajectories are a text protocol (a ``bash`` block per turn); each turn's command is
also sent as a Chat tool call, a Responses function call (JSON and exec-style arguments) and a
Messages ``tool_use``, which must read the same program.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.features.request import turn_shape
from router.learning.labels.replay import load, requests
from router.protocols import WIRES
from router.protocols.common import OPENAI_CHAT

SHIPPED = Path(__file__).resolve().parents[2] / "evals/data/trajectories/gemini-3-pro-preview.jsonl.gz"
#: The last ``bash`` block's command of a text turn.
BLOCK = re.compile(r"```bash[^\n]*\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def turns() -> list[list[dict[str, Any]]]:
    parse = WIRES[OPENAI_CHAT].parse
    return [parse(raw).messages for t in load(SHIPPED, limit=12) for raw in requests(t, "text")]


def test_a_real_turns_shape_is_the_characters_after_the_models_last_turn_and_of_that_turn(
    turns: list[list[dict[str, Any]]],
) -> None:
    assert len(turns) == 365
    for messages in turns:
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        new, reply, _ = turn_shape(messages)
        assert new == sum(len(m["content"]) for m in messages[last + 1 :])
        assert reply == (len(messages[last]["content"]) if last >= 0 else None)


def test_the_programs_real_turns_ran(turns: list[list[dict[str, Any]]]) -> None:
    verbs = Counter(turn_shape(m)[2] for m in turns)
    assert verbs == {"cat": 96, "python": 48, "sed": 40, "grep": 37, "pytest": 32, "nl": 25, "ls": 24, "rm": 16,
                     None: 14, "git": 12, "python3": 12, "find": 6, "head": 2, "cp": 1}  # fmt: skip


def test_a_real_command_reads_the_same_program_in_every_protocols_shape(
    turns: list[list[dict[str, Any]]],
) -> None:
    seen = 0
    for messages in turns:
        said = messages[-2] if len(messages) > 2 and messages[-2]["role"] == "assistant" else None
        blocks = BLOCK.findall(said["content"]) if said else []
        if not blocks:
            continue
        verb, command, answer = turn_shape(messages)[2], blocks[-1], messages[-1]
        args = orjson.dumps({"command": command}).decode()
        chat = {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "bash", "arguments": args}}]}  # fmt: skip
        shapes = [
            [chat, {"role": "tool", "tool_call_id": "c", "content": answer["content"]}],
            [{"type": "function_call", "name": "shell", "arguments": args, "call_id": "c"},
             {"type": "function_call_output", "call_id": "c", "output": answer["content"]}],
            [{"type": "function_call", "name": "shell", "call_id": "c",
              "arguments": orjson.dumps({"command": ["bash", "-lc", command]}).decode()},
             {"type": "function_call_output", "call_id": "c", "output": answer["content"]}],
            [{"role": "assistant", "content": [{"type": "text", "text": "Running it."},
                                               {"type": "tool_use", "id": "t", "name": "Bash", "input": {"command": command}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": answer["content"]}]}],
        ]  # fmt: skip
        for shape, tool in zip(shapes, ("bash", "shell", "shell", "Bash"), strict=True):
            # A command that starts with no program (a comment) is named by its tool, as a tool call is.
            assert turn_shape(shape)[2] == (verb or tool), (command[:80], shape[0])
        seen += 1
    assert seen > 300
