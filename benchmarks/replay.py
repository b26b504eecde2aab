"""Real agent traffic: SWE-bench runs of mini-swe-agent replayed turn by turn, as a tool-calling agent sends them.

Each run of the trajectory file (every message of a real Gemini 3 Pro run, see ``evals/data``) becomes
the requests its agent would have sent: request *k* carries the system prompt, the task and the first
*k* steps, each step an assistant turn with its ``bash`` tool call followed by the tool's output. So
bodies grow within a run from a few KB to hundreds of KB, and a proxy that remembers a conversation
sees exactly the prefix sharing a real agent gives it. Two shapes: OpenAI Chat (``tool_calls`` and
``role: tool``), and Anthropic Messages (``tool_use`` and ``tool_result`` blocks), as Claude Code sends.

Each worker replays one run at a time, from its first turn to its last, then starts the next run of the
file; every replay is its own task (a marker in the task text), so no two replays share a conversation.
Bodies are assembled from messages serialized once, so the generator costs a join per request.
"""

from __future__ import annotations

import gzip
import re
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
#: The copy kept with the project, else the shared data beside the checkout.
TRAJECTORIES = (
    ROOT / "evals" / "data" / "trajectories" / "gemini-3-pro-preview.jsonl.gz",
    ROOT.parent / "shared" / "data" / "trajectories" / "gemini-3-pro-preview.jsonl.gz",
)
_BASH = re.compile(r"```bash\s*\n(.*?)```", re.S)
_DESCRIPTION = "Run one bash command in the repository's shell and return its return code and output."
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": _DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "bash",
        "description": _DESCRIPTION,
        "input_schema": OPENAI_TOOLS[0]["function"]["parameters"],  # type: ignore[index]
    }
]


@dataclass(frozen=True, slots=True)
class Step:
    """One assistant turn and what the agent answered it with."""

    thought: str
    command: str | None  # None: the turn had no well-formed bash block (a format error followed)
    observation: str


@dataclass(frozen=True, slots=True)
class Run:
    instance_id: str
    system: str
    task: str
    steps: tuple[Step, ...]


def trajectory_file() -> Path:
    for path in TRAJECTORIES:
        if path.exists():
            return path
    raise SystemExit("no trajectory file: expected " + " or ".join(str(p) for p in TRAJECTORIES))


@cache
def load(path: Path | None = None, limit: int | None = None) -> tuple[Run, ...]:
    """The runs of a trajectory file (mini-swe-agent's text protocol) as steps."""
    runs: list[Run] = []
    with gzip.open(path or trajectory_file(), "rb") as f:
        for line in f:
            doc = orjson.loads(line)
            runs.append(_run(doc))
            if limit is not None and len(runs) >= limit:
                break
    return tuple(runs)


def _run(doc: dict[str, Any]) -> Run:
    messages = doc["messages"]
    system, task = messages[0]["content"], messages[1]["content"]
    steps: list[Step] = []
    rest = messages[2:]
    for i, m in enumerate(rest):
        if m["role"] != "assistant":
            continue
        text = m["content"]
        block = _BASH.search(text)
        nxt = rest[i + 1]["content"] if i + 1 < len(rest) and rest[i + 1]["role"] == "user" else ""
        thought = (text[: block.start()] if block else text).strip()
        steps.append(Step(thought, block.group(1).strip() if block else None, nxt))
    return Run(doc["instance_id"], system, task, tuple(steps))


def _openai_step(step: Step, i: int) -> list[bytes]:
    if step.command is None:
        return [
            orjson.dumps({"role": "assistant", "content": step.thought}),
            orjson.dumps({"role": "user", "content": step.observation}),
        ]
    call_id = f"call_{i}"
    call = {"id": call_id, "type": "function",
            "function": {"name": "bash", "arguments": orjson.dumps({"command": step.command}).decode()}}  # fmt: skip
    return [
        orjson.dumps({"role": "assistant", "content": step.thought or None, "tool_calls": [call]}),
        orjson.dumps({"role": "tool", "tool_call_id": call_id, "content": step.observation}),
    ]


def _anthropic_step(step: Step, i: int) -> list[bytes]:
    text = [{"type": "text", "text": step.thought}] if step.thought else []
    if step.command is None:
        return [
            orjson.dumps({"role": "assistant", "content": text or [{"type": "text", "text": "."}]}),
            orjson.dumps({"role": "user", "content": step.observation or "."}),
        ]
    tool_id = f"toolu_{i}"
    use = {"type": "tool_use", "id": tool_id, "name": "bash", "input": {"command": step.command}}
    result = {"type": "tool_result", "tool_use_id": tool_id, "content": step.observation}
    return [
        orjson.dumps({"role": "assistant", "content": [*text, use]}),
        orjson.dumps({"role": "user", "content": [result]}),
    ]


@dataclass(slots=True)
class _Cursor:
    head: bytes  # everything before the step messages, the replay's marked task included
    steps: list[bytes]
    turn: int = 0


@dataclass
class Replay:
    """Bodies for one target: ``next(worker, n)`` is that worker's next turn (``n`` is unique per request)."""

    runs: Sequence[Run]
    model: str
    stream: bool
    anthropic: bool
    #: Conversations in flight at once, each request advancing the next one in turn; None: one per worker.
    slots: int | None = None
    #: Body size and turn position (1-based) of every request sent.
    sizes: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    _cursors: dict[int, _Cursor] = field(default_factory=dict)
    _started: int = 0

    def next(self, worker: int, n: int) -> bytes:
        slot = worker if self.slots is None else n % self.slots
        cur = self._cursors.get(slot)
        if cur is None or cur.turn * 2 > len(cur.steps):
            cur = self._cursors[slot] = self._start(self.runs[self._started % len(self.runs)], n)
            self._started += 1
        done = cur.steps[: cur.turn * 2]
        body = b"".join((cur.head, b"," if done else b"", b",".join(done), b"]}"))
        cur.turn += 1
        self.sizes.append(len(body))
        self.turns.append(cur.turn)
        return body

    def _start(self, run: Run, replay_id: int) -> _Cursor:
        task = f"[replay {replay_id}] {run.task}"
        if self.anthropic:
            steps = [b for i, s in enumerate(run.steps[:-1]) for b in _anthropic_step(s, i)]
            head = orjson.dumps({"model": self.model, "max_tokens": 1024, "stream": self.stream,
                                 "system": run.system, "tools": ANTHROPIC_TOOLS})[:-1]  # fmt: skip
            first = orjson.dumps({"role": "user", "content": task})
        else:
            steps = [b for i, s in enumerate(run.steps[:-1]) for b in _openai_step(s, i)]
            head = orjson.dumps({"model": self.model, "stream": self.stream, "tools": OPENAI_TOOLS})[:-1]
            first = (
                orjson.dumps({"role": "system", "content": run.system})
                + b","
                + orjson.dumps({"role": "user", "content": task})
            )
        return _Cursor(head + b',"messages":[' + first, steps)


def describe(replays: Sequence[Replay]) -> str:
    """Bytes per request and turn positions over every replay of a scenario."""
    sizes = [s for r in replays for s in r.sizes]
    turns = [t for r in replays for t in r.turns]
    if not sizes:
        return "no requests"
    q = statistics.quantiles(sizes, n=10)
    return (
        f"{len(sizes):,} requests; body KB p10/p50/p90/max {q[0] / 1e3:.0f}/{statistics.median(sizes) / 1e3:.0f}/"
        f"{q[-1] / 1e3:.0f}/{max(sizes) / 1e3:.0f}; turn position p50/p90/max {statistics.median(turns):.0f}/"
        f"{statistics.quantiles(turns, n=10)[-1]:.0f}/{max(turns)}"
    )


def iter_bodies(runs: Sequence[Run], anthropic: bool, model: str = "m") -> Iterator[bytes]:
    """Every request of every run once, in order (for tests and one-off measurements)."""
    replay = Replay(runs, model, stream=False, anthropic=anthropic)
    for _ in range(sum(len(r.steps) for r in runs)):
        yield replay.next(0, len(replay.sizes))
