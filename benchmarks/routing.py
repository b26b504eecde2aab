"""Routing microbenchmark: the router's own per-request work before the upstream call, stage by stage.

``python -m benchmarks.routing [--quick] [--sizes 1000,10000,100000,200000]``

For coding-agent conversations of 1k to 200k tokens (OpenAI Chat, with tools), each stage the
proxy runs between reading the body and calling the backend is timed in µs, the way
``router.proxy`` and ``router.taskcontext`` call it:

* **first turn** — a conversation the router has never seen: a new one each iteration and a
  fresh ``TokenCounter`` (cold per-message caches);
* **next turn** — the same conversation plus one new tool call and its result, with the counter
  and the tool-result cache warm from the previous turn. The task vector is computed once per
  task, so it is not on this path.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks import bodies
from benchmarks.report import _markdown, percentile

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "examples" / "local.yaml"
SIZES = (1_000, 10_000, 100_000, 200_000)
STAGES = ("parse", "task_id", "hashes", "features", "task_vector", "signals", "fingerprint", "decide")
#: Bytes per token of the generated conversations, a first guess refined by counting.
_BYTES_PER_TOKEN = 3.6


@dataclass
class Case:
    size: int
    turn: str
    tokens: int
    messages: int
    kilobytes: float
    samples: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in (*STAGES, "total")})

    def as_dict(self) -> dict[str, Any]:
        stats = {
            s: {"p50_us": percentile(v, 50), "p99_us": percentile(v, 99)} for s, v in self.samples.items()
        }
        return {"size": self.size, "turn": self.turn, "tokens": self.tokens, "messages": self.messages,
                "kilobytes": self.kilobytes, "iterations": len(self.samples["total"]), "stages": stats}  # fmt: skip


class Pipeline:
    """The router's pre-call stages, built from the demo policy."""

    def __init__(self, policy: Path = POLICY) -> None:
        from router import tasks
        from router.policy.runtime import load_runtime
        from router.tokens import TokenCounter

        self.runtime = load_runtime(policy)
        self.encoding = TokenCounter().encoding
        self.key_hash = tasks.client_key_hash("bench")
        self.loop_threshold = self.runtime.policy.spec.tasks.loop_threshold

    def counter(self) -> Any:
        from router.tokens import TokenCounter

        return TokenCounter(encoding=self.encoding)

    def run(self, raw: bytes, counter: Any, first_turn: bool, out: dict[str, list[float]]) -> None:
        """One request through every stage, appending each stage's µs to ``out``."""
        from router import features, signals, taskcontext, tasks
        from router.protocols import openai_chat

        clock = time.perf_counter_ns
        t0 = clock()
        req = openai_chat.parse(raw)
        t1 = clock()
        tasks.task_id(req, None, self.key_hash)
        t2 = clock()
        req.tools_sha256(), req.system_sha256()
        t3 = clock()
        feats = features.extract(req, counter, {})
        t4 = clock()
        if first_turn:
            feats.task_vector = taskcontext.vector_for(req)
        t5 = clock()
        signals.extract(req.protocol, req.messages, loop_threshold=self.loop_threshold)
        t6 = clock()
        req.body_hash = hash(raw)  # the proxy's fingerprint of a re-sent request
        t7 = clock()
        self.runtime.decider.decide(feats)
        t8 = clock()
        marks = (t0, t1, t2, t3, t4, t5, t6, t7, t8)
        for stage, a, b in zip(STAGES, marks, marks[1:], strict=False):
            if stage != "task_vector" or first_turn:
                out[stage].append((b - a) / 1000)
        out["total"].append((t8 - t0) / 1000)


def conversation(
    tokens: int, pipe: Pipeline, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A coding-agent conversation of about ``tokens`` tokens (a message per ~1k tokens, 4 to 200)."""
    n = max(4, min(200, tokens // 1000))
    n += n % 2
    size = int(tokens * _BYTES_PER_TOKEN)
    for _ in range(3):
        messages, tools = bodies.agent_conversation(n, size, seed=seed, task=f"routing-{seed}")
        counted = pipe.counter().count_openai_chat(messages, tools)
        if abs(counted - tokens) <= tokens * 0.03:
            break
        size = int(size * tokens / counted)
    return messages, tools


def _body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": "auto", "messages": messages, "tools": tools, "stream": True})


def measure(size: int, pipe: Pipeline, budget_s: float, max_iterations: int = 2000) -> list[Case]:
    """The first-turn and next-turn cases of one conversation size."""
    messages, tools = conversation(size, pipe)
    base = _body(messages, tools)
    tokens = pipe.counter().count_openai_chat(messages, tools)
    first = Case(size, "first", tokens, len(messages), len(base) / 1024)
    nxt = Case(size, "next", tokens, len(messages) + 2, len(base) / 1024)

    def loop(case: Case, make: Callable[[int], tuple[bytes, Any]], first_turn: bool) -> None:
        deadline = time.perf_counter() + budget_s
        for i in range(max_iterations):
            raw, counter = make(i)
            # Two unrecorded runs pay one-off costs (imports, pydantic's first validation).
            pipe.run(raw, counter, first_turn, case.samples if i >= 2 else _scratch())
            if i >= 6 and time.perf_counter() > deadline:
                break

    def first_turn(i: int) -> tuple[bytes, Any]:
        if i == 0:
            return base, pipe.counter()
        return _body(_reseeded(messages, i), tools), pipe.counter()

    warm = pipe.counter()
    pipe.run(base, warm, True, _scratch())  # the previous turn: caches now hold this conversation

    def next_turn(i: int) -> tuple[bytes, Any]:
        rng = random.Random(10_000 + i)
        tail = bodies.tool_turn(rng, len(messages) // 2 + i, max(400, size * 4 // max(1, len(messages))))
        return _body([*messages, *tail], tools), warm

    loop(first, first_turn, True)
    loop(nxt, next_turn, False)
    return [first, nxt]


def _reseeded(messages: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    # A cheap "new conversation": the same shape with every text changed, so no cache can hit.
    mark = f" [{i}]"
    return [
        {**m, "content": m["content"] + mark} if isinstance(m.get("content"), str) else m for m in messages
    ]


def _scratch() -> dict[str, list[float]]:
    return {s: [] for s in (*STAGES, "total")}


def table(cases: Sequence[Case]) -> str:
    header = [
        "tokens",
        "turn",
        "msgs",
        "KB",
        "iters",
        "total p50",
        "total p99",
        *(f"{s} p50/p99" for s in STAGES),
    ]
    lines = [header]
    for c in cases:
        cells = [
            f"{c.tokens:,}",
            c.turn,
            str(c.messages),
            f"{c.kilobytes:,.0f}",
            str(len(c.samples["total"])),
        ]
        cells += [_us(percentile(c.samples["total"], 50)), _us(percentile(c.samples["total"], 99))]
        for s in STAGES:
            v = c.samples[s]
            cells.append("–" if not v else f"{_us(percentile(v, 50))} / {_us(percentile(v, 99))}")
        lines.append(cells)
    return _markdown(lines)


def dominant(cases: Sequence[Case]) -> str:
    """Per case, the two stages with the largest share of the time (summed over iterations)."""
    out = []
    for c in cases:
        total = sum(c.samples["total"])
        shares = {s: sum(v) / total for s, v in c.samples.items() if s != "total" and v and total}
        top = sorted(shares.items(), key=lambda kv: -kv[1])[:2]
        out.append(f"  {c.tokens:>7,} tokens, {c.turn:<5} turn: " + ", ".join(f"{s} {x:.0%}" for s, x in top))
    return "\n".join(out)


def _us(v: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def run(sizes: Sequence[int] = SIZES, budget_s: float = 1.5, max_iterations: int = 2000) -> list[Case]:
    pipe = Pipeline()
    cases: list[Case] = []
    for size in sizes:
        cases.extend(measure(size, pipe, budget_s, max_iterations))
    return cases


def render(cases: Sequence[Case]) -> str:
    return (
        "Routing microbenchmark (features + decision, in-process, µs; demo policy):\n"
        + table(cases)
        + "\nLargest stages (share of the summed time):\n"
        + dominant(cases)
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="conversation sizes in tokens")
    p.add_argument("--budget", type=float, default=1.5, help="seconds per case (at least 5 iterations)")
    p.add_argument("--quick", action="store_true", help="0.2 s per case")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    cases = run(sizes, 0.2 if args.quick else args.budget)
    print(render(cases))
    if args.json:
        args.json.write_bytes(orjson.dumps([c.as_dict() for c in cases], option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
