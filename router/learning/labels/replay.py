"""Agent trajectories replayed as the requests their agent sent, in either shape, through the proxy's path.

A trajectory (one JSON object a line, gzipped or not: ``instance_id``, ``resolved``, ``messages``
in mini-swe-agent's text protocol, assistant messages with ``usage.cost``) becomes the requests
its agent made: one before each assistant turn, holding everything said so far. In the ``text``
shape they are sent as recorded; in the ``tools`` shape each ``bash`` block becomes a ``bash``
tool call and each observation that tool's ``role: tool`` result, as a tool-calling agent sends
them (OpenAI Chat Completions). The turn that submits is a reply, never part of a request: the
router does not see the submitted diff, so neither does the replay.

Each request goes through what the proxy does with it: the protocol parser, the conversation
memo (its per-message slots), the switch signals, then the label (``context.weak_label``).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from router.features import signals
from router.features.labels.model import LabelModel
from router.features.memo import ConversationMemo
from router.features.promptsize import PromptSizer
from router.features.signals.base import WeakLabel
from router.features.signals.transcript import TEXT_TOOL, text_command, text_result
from router.features.task.context import weak_label
from router.features.tokens import TokenCounter
from router.protocols import WIRES
from router.protocols.common import OPENAI_CHAT

SHAPES: Final = ("tools", "text")
DEFAULT_TRAJECTORIES: Final = Path("evals/data/trajectories/gemini-3-pro-preview.jsonl.gz")
#: The memo's bound in the replay: one conversation at a time, the largest fits.
_MEMO_BYTES: Final = 256 << 20


@dataclass(frozen=True, slots=True)
class Trajectory:
    instance_id: str
    resolved: bool
    messages: list[dict[str, Any]]

    def turn_costs(self) -> list[float]:
        """The cost of each assistant turn (USD, as the provider reported it), in order."""
        return [
            float((m.get("usage") or {}).get("cost") or 0.0)
            for m in self.messages
            if m.get("role") == "assistant"
        ]


def load(path: str | Path, limit: int | None = None) -> list[Trajectory]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    out: list[Trajectory] = []
    with opener(p, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            obj = orjson.loads(line)
            out.append(Trajectory(str(obj["instance_id"]), bool(obj["resolved"]), list(obj["messages"])))
            if limit is not None and len(out) >= limit:
                break
    return out


def _tool_shape(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as a tool-calling agent sends it (OpenAI Chat Completions)."""
    out: list[dict[str, Any]] = []
    pending: str | None = None
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role == "assistant":
            command = text_command(content)
            if command is None:
                out.append({"role": "assistant", "content": content})
                continue
            pending = f"call_{i}"
            thought = str(content).split("```bash", 1)[0].rstrip()
            args = orjson.dumps({"command": command}).decode()
            call = {"id": pending, "type": "function", "function": {"name": TEXT_TOOL, "arguments": args}}
            out.append({"role": "assistant", "content": thought or None, "tool_calls": [call]})
        elif role == "user" and pending is not None and text_result(content) is not None:
            out.append({"role": "tool", "tool_call_id": pending, "content": content})
            pending = None
        else:
            out.append({"role": role, "content": content})
    return out


_BASH_TOOL: Final = {
    "type": "function",
    "function": {
        "name": TEXT_TOOL,
        "description": "Run one bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def requests(t: Trajectory, shape: str, model: str = "replay") -> Iterator[bytes]:
    """The request bodies the agent sent, in order (one before each assistant turn)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    plain = [{"role": m["role"], "content": m["content"]} for m in t.messages]
    msgs = _tool_shape(plain) if shape == "tools" else plain
    extra = {"tools": [_BASH_TOOL]} if shape == "tools" else {}
    # Both shapes keep one message per recorded message, so request k ends where the text's does.
    for k, m in enumerate(t.messages):
        if k >= 2 and m.get("role") == "assistant":
            yield orjson.dumps({"model": model, "messages": msgs[:k], **extra})


@dataclass(frozen=True, slots=True)
class Turn:
    """What the router knew at one request of a replayed attempt."""

    turn: int
    label: WeakLabel
    #: The hand-weighted label the router wrote before the model (for comparison), if any.
    rules: WeakLabel | None


def replay(t: Trajectory, shape: str, model: LabelModel, loop_threshold: int = 3) -> list[Turn]:
    """Every request of ``t`` through the proxy's path (parser, memo, switch signals, label)."""
    wire = WIRES[OPENAI_CHAT]
    sizer = PromptSizer(TokenCounter(), ConversationMemo(_MEMO_BYTES))
    out: list[Turn] = []
    for turn, raw in enumerate(requests(t, shape), 1):
        req = wire.parse(raw)
        size = sizer.measure(req, t.instance_id, len(raw))
        signals.switches(req.protocol, req.messages, loop_threshold=loop_threshold, seen=size.facts)
        label = weak_label(req, loop_threshold, size.repeat, size.facts, model)
        found = signals.extract(req.protocol, req.messages, loop_threshold=loop_threshold, seen=size.facts)
        out.append(Turn(turn, label, signals.summarize(found)))
    return out
