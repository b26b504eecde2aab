"""Routing microbenchmark: the router's own per-request work before the upstream call, stage by stage.

``python -m benchmarks.routing [--quick] [--sizes 1000,10000,100000,200000] [--anthropic-sizes 100000]``

For coding-agent conversations of 1k to 200k tokens (OpenAI Chat with tools, and Anthropic
Messages shaped as Claude Code sends them: content blocks, the cache marker on the last
message), each stage the proxy runs between reading the body and calling the backend is timed
in µs, in the order and the way ``Proxy.decide`` and ``router.features.task.context`` run it:

* **first turn** — a conversation the router has never seen: a new one each iteration, with a
  fresh ``TokenCounter`` and conversation memo (cold caches);
* **next turn** — the conversation the router saw last plus one new tool call and its result,
  with the counter and the memo warm from that previous turn. The task vector is computed once
  per task, so it is not on this path.

``features`` is the prompt size from the memo, the counter's cache and an estimate of the rest;
``exact`` is the count made before deciding when the estimate's bounds straddle a rule or a
context window. ``signals`` are those that may move the task off its model (loops, failure
runs). The exact count of what was estimated otherwise (once the reply is out, or on a worker
thread) and the weak outcome label (the results read in full) run after the decision: they are
timed apart, as ``deferred``.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from benchmarks import bodies, learned
from benchmarks.report import _markdown, percentile

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1_000, 10_000, 100_000, 200_000)
ANTHROPIC_SIZES = (100_000,)
STAGES = ("parse", "task_id", "hashes", "features", "task_vector", "signals", "exact", "decide")
#: Timed apart: work the proxy does for the request, but not before calling the backend.
OFF_PATH = ("deferred",)
#: Bytes per token of the generated conversations, a first guess refined by counting.
_BYTES_PER_TOKEN = 3.6
_MEMORY = 64 * 1024 * 1024


@dataclass
class Case:
    size: int
    protocol: str
    turn: str
    tokens: int
    messages: int
    kilobytes: float
    samples: dict[str, list[float]] = field(
        default_factory=lambda: {s: [] for s in (*STAGES, *OFF_PATH, "total", "after_parse")}
    )

    def as_dict(self) -> dict[str, Any]:
        stats = {
            s: {"p50_us": percentile(v, 50), "p99_us": percentile(v, 99)} for s, v in self.samples.items()
        }
        return {"size": self.size, "protocol": self.protocol, "turn": self.turn, "tokens": self.tokens,
                "messages": self.messages, "kilobytes": self.kilobytes,
                "iterations": len(self.samples["total"]), "stages": stats}  # fmt: skip


class Pipeline:
    """The router's pre-call stages, built from the demo policy with a learned artifact."""

    def __init__(self, policy: Path | None = None) -> None:
        from router.features.task.identity import client_key_hash
        from router.features.tokens import TokenCounter
        from router.policy.active import load_active_policy

        if policy is None:
            with tempfile.TemporaryDirectory(prefix="router-routing-") as tmp:
                self.runtime = load_active_policy(learned.write(Path(tmp)))  # the artifact is read now
        else:
            self.runtime = load_active_policy(policy)
        #: Task vectors by task id, as the router keeps them in its task state (made once per task).
        self.vectors: dict[str, Any] = {}
        self.encoding = TokenCounter().encoding
        self.key_hash = client_key_hash("bench")
        self.loop_threshold = self.runtime.policy.spec.tasks.loop_threshold

    def counter(self) -> Any:
        from router.features.tokens import TokenCounter

        return TokenCounter(encoding=self.encoding)

    def sizer(self) -> Any:
        """A fresh counter and conversation memo, as the app builds them."""
        from router.features.memo import ConversationMemo
        from router.features.promptsize import PromptSizer

        return PromptSizer(self.counter(), ConversationMemo(_MEMORY))

    def run(
        self, raw: bytes, protocol: str, sizer: Any, first_turn: bool, out: dict[str, list[float]]
    ) -> Any:
        """One request through every stage, appending each stage's µs to ``out``; returns the request."""
        from router.features import signals
        from router.features.task.context import vector_for, weak_label
        from router.features.task.identity import task_id_of
        from router.features.task.vector import Packed
        from router.policy.pipeline import request_features
        from router.protocols import WIRES

        decider = self.runtime.decider
        clock = time.perf_counter_ns
        t0 = clock()
        req = WIRES[protocol].parse(raw)
        t1 = clock()
        task = task_id_of(req, None, self.key_hash)
        t2 = clock()
        req.tools_sha256(), req.system_sha256()
        t3 = clock()
        size = sizer.measure(req, task, len(raw))
        feats = request_features(req, size.tokens, {})
        t4 = clock()
        if first_turn:
            self.vectors[task] = Packed(vector_for(req))  # as the tracker keeps it
        feats = replace(feats, task_vector=self.vectors.get(task))
        t5 = clock()
        signals.switches(req.protocol, req.messages, loop_threshold=self.loop_threshold, seen=size.facts)
        t6 = clock()
        if not size.settled and decider.size_matters(feats, size.low, size.high):
            feats = replace(feats, prompt_tokens=sizer.settle(size))
        t7 = clock()
        decider.decide(feats)
        t8 = clock()
        if not size.settled:
            sizer.settle(size)
        weak_label(req, self.loop_threshold, size.repeat, size.facts)
        t9 = clock()
        marks = (t0, t1, t2, t3, t4, t5, t6, t7, t8)
        for stage, a, b in zip(STAGES, marks, marks[1:], strict=False):
            if stage != "task_vector" or first_turn:
                out[stage].append((b - a) / 1000)
        out["total"].append((t8 - t0) / 1000)
        out["after_parse"].append((t8 - t1) / 1000)
        out["deferred"].append((t9 - t8) / 1000)
        return req


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


def _body(protocol: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    if protocol == "anthropic":
        return orjson.dumps(anthropic_body(messages, tools))
    return orjson.dumps({"model": "auto", "messages": messages, "tools": tools, "stream": True})


def anthropic_body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The conversation as Claude Code sends it: system and tool blocks, the cache marker last."""
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": messages[0]["content"], "cache_control": mark}]
    out: list[dict[str, Any]] = []
    for m in messages[1:]:
        if m["role"] == "assistant":
            blocks = [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": orjson.loads(c["function"]["arguments"])}
                for c in m["tool_calls"]
            ]  # fmt: skip
            out.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            out.append({"role": "user", "content": [result]})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    out[-1] = {
        **out[-1],
        "content": [*out[-1]["content"][:-1], {**out[-1]["content"][-1], "cache_control": mark}],
    }
    defs = [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]}
        for t in tools
    ]  # fmt: skip
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": system, "messages": out,
            "tools": defs, "stream": True,
            "metadata": {"user_id": "user_bench_account__session_0b1c2d3e-routing"}}  # fmt: skip


def measure(
    size: int, pipe: Pipeline, budget_s: float, max_iterations: int = 2000, protocol: str = "openai_chat"
) -> list[Case]:
    """The first-turn and next-turn cases of one conversation size."""
    from router.features import signals

    # What earlier cases read (the same tool results, in another protocol's shape) is not known
    # to a router seeing this conversation: only its own previous turn is (run below).
    signals.clear_caches()
    messages, tools = conversation(size, pipe)
    base = _body(protocol, messages, tools)
    tokens = pipe.counter().count_openai_chat(messages, tools)
    first = Case(size, protocol, "first", tokens, len(messages), len(base) / 1024)
    nxt = Case(size, protocol, "next", tokens, len(messages) + 2, len(base) / 1024)

    def loop(case: Case, make: Callable[[int], tuple[bytes, Any]], first_turn: bool) -> None:
        deadline = time.perf_counter() + budget_s
        for i in range(max_iterations):
            raw, sizer = make(i)
            # Two unrecorded runs pay one-off costs (imports, pydantic's first validation).
            pipe.run(raw, protocol, sizer, first_turn, case.samples if i >= 2 else _scratch())
            if i >= 6 and time.perf_counter() > deadline:
                break

    def first_turn(i: int) -> tuple[bytes, Any]:
        if i == 0:
            return base, pipe.sizer()
        return _body(protocol, _reseeded(messages, i), tools), pipe.sizer()

    warm = pipe.sizer()
    # The previous turn: the memo and the counter now hold this conversation, counted.
    previous = pipe.run(base, protocol, warm, True, _scratch())
    snapshot = warm.memo.match(_task(pipe, previous), previous.messages, None, None).snapshot

    def next_turn(i: int) -> tuple[bytes, Any]:
        rng = random.Random(10_000 + i)
        tail = bodies.tool_turn(rng, len(messages) // 2 + i, max(400, size * 4 // max(1, len(messages))))
        # Each iteration is the turn after ``base`` (not after the previous iteration's turn, which
        # was a different continuation): put ``base`` back as the task's latest request, untimed.
        warm.memo.remember(_task(pipe, previous), snapshot, replaces=snapshot)
        return _body(protocol, [*messages, *tail], tools), warm

    loop(first, first_turn, True)
    loop(nxt, next_turn, False)
    return [first, nxt]


def _task(pipe: Pipeline, req: Any) -> str:
    from router.features.task.identity import task_id_of

    return task_id_of(req, None, pipe.key_hash)


def _reseeded(messages: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    # A cheap "new conversation": the same shape with every text changed, so no cache can hit.
    mark = f" [{i}]"
    return [
        {**m, "content": m["content"] + mark} if isinstance(m.get("content"), str) else m for m in messages
    ]


def _scratch() -> dict[str, list[float]]:
    return {s: [] for s in (*STAGES, *OFF_PATH, "total", "after_parse")}


def table(cases: Sequence[Case]) -> str:
    header = [
        "tokens",
        "protocol",
        "turn",
        "msgs",
        "KB",
        "iters",
        "features+decision p50/p99",
        "with parse p50/p99",
        *(f"{s} p50/p99" for s in STAGES),
        "deferred (off the request path) p50/p99",
    ]
    lines = [header]
    for c in cases:
        cells = [
            f"{c.tokens:,}",
            "anthropic" if c.protocol == "anthropic" else "chat",
            c.turn,
            str(c.messages),
            f"{c.kilobytes:,.0f}",
            str(len(c.samples["total"])),
        ]
        for s in ("after_parse", "total", *STAGES, *OFF_PATH):
            v = c.samples[s]
            cells.append("–" if not v else f"{_us(percentile(v, 50))} / {_us(percentile(v, 99))}")
        lines.append(cells)
    return _markdown(lines)


def dominant(cases: Sequence[Case]) -> str:
    """Per case, the two stages with the largest share of the request-path time (summed over iterations)."""
    out = []
    for c in cases:
        total = sum(c.samples["total"])
        shares = {s: sum(c.samples[s]) / total for s in STAGES if c.samples[s] and total}
        top = sorted(shares.items(), key=lambda kv: -kv[1])[:2]
        out.append(
            f"  {c.tokens:>7,} tokens, {c.protocol:<11} {c.turn:<5} turn: "
            + ", ".join(f"{s} {x:.0%}" for s, x in top)
        )
    return "\n".join(out)


def _us(v: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def run(
    sizes: Sequence[int] = SIZES,
    budget_s: float = 1.5,
    max_iterations: int = 2000,
    anthropic_sizes: Sequence[int] = (),
    pipe: Pipeline | None = None,
) -> list[Case]:
    pipe = pipe or Pipeline()
    cases: list[Case] = []
    for size in sizes:
        cases.extend(measure(size, pipe, budget_s, max_iterations))
    for size in anthropic_sizes:
        cases.extend(measure(size, pipe, budget_s, max_iterations, protocol="anthropic"))
    return cases


def render(cases: Sequence[Case]) -> str:
    return (
        "Routing microbenchmark (in-process, µs; demo policy, learned scorer). features+decision: every stage after\n"
        "parsing the body; with parse: the same plus parsing; deferred: not on the request path.\n"
        + table(cases)
        + "\nLargest stages on the request path (share of the summed time with parse):\n"
        + dominant(cases)
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="chat conversation sizes in tokens")
    p.add_argument("--anthropic-sizes", default=",".join(map(str, ANTHROPIC_SIZES)),
                   help="Anthropic conversation sizes in tokens (empty: none)")  # fmt: skip
    p.add_argument("--budget", type=float, default=1.5, help="seconds per case (at least 5 iterations)")
    p.add_argument("--quick", action="store_true", help="0.2 s per case")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    anthropic_sizes = [int(s) for s in args.anthropic_sizes.split(",") if s]
    pipe = Pipeline()
    # As `router serve` does once started: what was loaded so far is never collected, so
    # collections walk only what requests made (router.app.serve.DrainingServer.startup).
    gc.collect()
    gc.freeze()
    cases = run(sizes, 0.2 if args.quick else args.budget, anthropic_sizes=anthropic_sizes, pipe=pipe)
    print(render(cases))
    if args.json:
        args.json.write_bytes(orjson.dumps([c.as_dict() for c in cases], option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
