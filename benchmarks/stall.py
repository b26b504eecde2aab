"""``python -m benchmarks.stall``: do other clients' streams stall while a large body is handled?

One authenticated client's large body (tens of thousands of tool definitions, or a conversation
of tens of thousands of messages: 10-30 MB of small JSON values) is parsed and sized by the
router; whatever of that runs on the event loop holds every other request in flight as long.
This drives a steady load of small streamed chat requests (``--streams`` at once, each a 20-chunk
stream whose chunks the fake upstream spaces ``--chunk-ms`` apart) and measures, per request, the
time to its first content byte (TTFT), the gaps between the chunks it receives and the longest of
those waits; first with the small requests alone, then with one client sending large bodies one
after another (``--big-mb``, alternating the two shapes, each body distinct) beside them. A
router that refuses one (more tools than ``router.protocols.common.MAX_TOOLS``: a 400) still
parses it first. It prints the small requests' percentiles in both phases, and how the large
ones were answered and how long they took.

The small requests go to the fake upstream (``router.fakeupstream``); the large ones to a sink
in this process that reads the body without parsing it and answers a fixed reply, so no upstream
parsing 30 MB shares the driver's core with the load generator. The router runs on its own core
(as ``make bench`` pins it), on a policy of two pinned routes, in open mode. ``--against DIR``
starts a second router from another checkout (e.g. ``git archive REV | tar -x -C DIR``) beside
this one and runs its phases interleaved with this one's: before and after, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from benchmarks import bodies
from benchmarks.procs import Service, Services, choose_pinning, free_port, machine
from benchmarks.run import ROOT, _commit, _run, entry, handle_interrupts

CHUNKS = 20
SMALL, BIG = "small", "big"
HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}
#: The sink's answer to a large body (a whole chat completion with usage).
SINK_REPLY = orjson.dumps(
    {
        "id": "chatcmpl-sink", "object": "chat.completion", "created": 0, "model": "big-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001},
    }
)  # fmt: skip


def policy(small_url: str, sink_url: str) -> str:
    """Two pinned routes: ``small`` to the fake upstream, ``big`` to the sink (a window that holds it)."""
    model = ("  - {{id: {id}, litellm_model: openai/{id}-model, protocol: openai, api_base: {url}/v1, "
             "prices: {{input: 0.1, output: 0.4}}, context_window: {window}, max_output_tokens: 4096}}")  # fmt: skip
    return "\n".join(
        [
            "version: 1",
            "name: stall-bench",
            "models:",
            model.format(id=SMALL, url=small_url, window=128_000),
            model.format(id=BIG, url=sink_url, window=100_000_000),
            "routes:",
            f"  - {{match: {SMALL}, passthrough: {SMALL}}}",
            f"  - {{match: {BIG}, passthrough: {BIG}}}",
            "",
        ]
    )


def tools_body(mb: float) -> bodies.Template:
    """A chat request offering tools until the body is ``mb`` MB (the hostile probe's shape)."""
    tool = {"type": "function", "function": {"name": "t", "description": "Reads a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}  # fmt: skip
    n = int(mb * 1e6 / len(orjson.dumps(tool)))
    tools = [{**tool, "function": {**tool["function"], "name": f"tool_{i}"}} for i in range(n)]  # type: ignore[dict-item]
    return bodies.template(
        {
            "model": BIG,
            "messages": [
                {"role": "user", "content": f"Task {bodies.TASK}: list the files. {bodies.REQUEST}"}
            ],
            "tools": tools,
        }
    )


def conversation_body(mb: float) -> bodies.Template:
    """A chat request whose conversation is short tool calls and results until it is ``mb`` MB."""
    step = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
         "function": {"name": "bash", "arguments": '{"command": "ls -la src/"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "total 8\nparser.py\nhandler.py\n"},
    ]  # fmt: skip
    n = int(mb * 1e6 / len(orjson.dumps(step)))
    messages: list[object] = [{"role": "user", "content": f"Task {bodies.TASK}: list the files."}]
    for _ in range(n):
        messages.extend(step)
    messages.append({"role": "user", "content": f"Go on. {bodies.REQUEST}"})
    bash = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    return bodies.template({"model": BIG, "messages": messages, "tools": [bash]})


@dataclass
class Phase:
    """What the small requests saw over one phase, and the large ones sent meanwhile."""

    ttfts_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    #: Per request, its longest wait: for its first content byte or between two chunks.
    worst_ms: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    #: Seconds each large body took to be answered, and the statuses it was answered with.
    big_s: list[float] = field(default_factory=list)
    big_statuses: Counter[int] = field(default_factory=Counter)
    big_errors: int = 0
    first_error: str | None = None


async def small_stream(session: aiohttp.ClientSession, url: str, body: bytes, out: Phase) -> None:
    started = time.perf_counter()
    arrivals: list[float] = []
    try:
        async with session.post(url, data=body, headers=HEADERS) as resp:
            async for chunk in resp.content.iter_any():
                if chunk:
                    arrivals.append(time.perf_counter())
            ok = resp.status == 200
    except (aiohttp.ClientError, TimeoutError) as exc:
        ok = False
        out.first_error = out.first_error or f"{type(exc).__name__}: {exc}"
    out.requests += 1
    if not ok or not arrivals:
        out.errors += 1
        return
    out.ttfts_ms.append((arrivals[0] - started) * 1000)
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
    out.gaps_ms.extend(gaps)
    out.worst_ms.append(max([out.ttfts_ms[-1], *gaps]))


def big_sender(url: str, templates: Sequence[bodies.Template], stop: threading.Event, pause_s: float,
               out: Phase, counter: itertools.count[int]) -> None:  # fmt: skip
    """Large bodies one after another from a thread of its own (blocking sends let go of the GIL)."""
    host, port = url.removeprefix("http://").split(":")
    for i in itertools.count():
        if stop.wait(pause_s):
            return
        n = next(counter)
        body = templates[i % len(templates)].render(n, n)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        started = time.perf_counter()
        try:
            conn.request("POST", "/v1/chat/completions", body=body, headers=HEADERS)
            reply = conn.getresponse()
            reply.read()
            out.big_s.append(time.perf_counter() - started)
            out.big_statuses[reply.status] += 1
        except OSError as exc:
            out.big_errors += 1
            out.first_error = out.first_error or f"large body: {exc}"
        finally:
            conn.close()


async def phase(url: str, streams: int, duration_s: float, big: Sequence[bodies.Template], pause_s: float,
                counter: itertools.count[int]) -> Phase:  # fmt: skip
    out = Phase()
    small = bodies.template(bodies.chat_body(SMALL, stream=True))
    deadline = time.perf_counter() + duration_s
    stop = threading.Event()
    sender = threading.Thread(target=big_sender, args=(url, big, stop, pause_s, out, counter), daemon=True)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:  # fmt: skip

        async def worker() -> None:
            while time.perf_counter() < deadline:
                n = next(counter)
                await small_stream(session, url + "/v1/chat/completions", small.render(n % 64, n), out)

        if big:
            sender.start()
        await asyncio.gather(*(worker() for _ in range(streams)))
        stop.set()
        if big:
            await asyncio.to_thread(sender.join, 180)
    return out


async def sink(port: int) -> web.AppRunner:
    """An upstream for the large bodies: reads each without parsing it, answers ``SINK_REPLY``."""

    async def answer(request: web.Request) -> web.Response:
        while await request.content.readany():
            pass
        return web.Response(body=SINK_REPLY, content_type="application/json")

    app = web.Application(client_max_size=2**31)
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, load: str, p: Phase) -> str:
    statuses = ", ".join(f"{n} x {status}" for status, n in sorted(p.big_statuses.items()))
    big = (f"{statuses}{f', {p.big_errors} failed' if p.big_errors else ''}; "
           f"{statistics.median(p.big_s):.2f} / {max(p.big_s):.2f} s" if p.big_s
           else ("–" if not p.big_errors else f"{p.big_errors} failed"))  # fmt: skip
    return (
        f"| {name} | {load} | {p.requests} ({p.errors} failed) "
        f"| {statistics.median(p.ttfts_ms):.1f} / {pct(p.ttfts_ms, 0.99):.1f} / {max(p.ttfts_ms):.0f} "
        f"| {statistics.median(p.gaps_ms):.1f} / {pct(p.gaps_ms, 0.99):.1f} / {max(p.gaps_ms):.0f} "
        f"| {pct(p.worst_ms, 0.99):.0f} / {max(p.worst_ms):.0f} | {sum(w > 100 for w in p.worst_ms)} | {big} |"
    )


def launch_router(
    svc: Services, name: str, root: Path, config: Path, workdir: Path, core: int | None
) -> Service:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "OTEL_"))}
    env.update(PYTHONPATH=str(root), ROUTER_DRAIN_DELAY="0", ROUTER_DRAIN_TIMEOUT="5", ROUTER_PRELOAD="1")
    argv = [sys.executable, "-m", "router.app.cli", "serve", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--store", f"sqlite:///{workdir / f'{name}.db'}", "--log-level", "warning"]  # fmt: skip
    return svc.launch(name, argv, url=f"http://127.0.0.1:{port}", core=core, env=env, cwd=root)


async def drive(args: argparse.Namespace, routers: dict[str, str], sink_port: int) -> list[str]:
    runner = await sink(sink_port)
    counter = itertools.count()
    big = [tools_body(args.big_mb), conversation_body(args.big_mb)]
    sizes = ", ".join(f"{len(t.head) + len(t.middle) + len(t.tail) + 8:,}" for t in big)
    print(f"large bodies: {sizes} bytes (tools, conversation)", file=sys.stderr, flush=True)
    lines = []
    try:
        for url in routers.values():  # warm-up: connections, lazy imports, first-turn caches
            await phase(url, args.streams, 2.0, [], 0, counter)
        results: dict[tuple[str, str], list[Phase]] = {}
        for r in range(args.rounds):
            for name, url in routers.items():
                for load, templates in (("alone", []), ("with large bodies", big)):
                    print(f"round {r + 1}: {name}, {load}", file=sys.stderr, flush=True)
                    p = await phase(url, args.streams, args.duration, templates, args.pause, counter)
                    results.setdefault((name, load), []).append(p)
                    if p.first_error:
                        print(f"  first error: {p.first_error}", file=sys.stderr, flush=True)
        for (name, load), phases in results.items():
            merged = Phase()
            for p in phases:
                for f in ("ttfts_ms", "gaps_ms", "worst_ms", "big_s"):
                    getattr(merged, f).extend(getattr(p, f))
                merged.requests += p.requests
                merged.errors += p.errors
                merged.big_errors += p.big_errors
                merged.big_statuses.update(p.big_statuses)
            lines.append(row(name, load, merged))
    finally:
        await runner.cleanup()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.stall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--streams", type=int, default=8, help="small streamed requests at once (default 8)")
    p.add_argument(
        "--chunk-ms", type=float, default=10.0, help="the upstream's pause between chunks (default 10)"
    )
    p.add_argument("--big-mb", type=float, default=20.0, help="size of each large body in MB (default 20)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between two large bodies (default 0.5)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per phase (default 20)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of phases, interleaved across routers")
    p.add_argument("--against", type=Path, metavar="DIR", help="also run the router of this checkout")
    p.add_argument("--no-pin", action="store_true", help="do not pin the router to a core of its own")
    args = p.parse_args(argv)
    handle_interrupts()
    pin = choose_pinning(not args.no_pin)
    if pin.driver is not None:
        os.sched_setaffinity(0, {pin.driver})
    workdir = Path(tempfile.mkdtemp(prefix="router-stall-"))
    info = machine()
    try:
        with Services(workdir) as svc:
            up_port, sink_port = free_port(), free_port()
            upstream = svc.launch(
                "upstream",
                [sys.executable, "-m", "router.fakeupstream", "--host", "127.0.0.1", "--port", str(up_port),
                 "--behaviour", f"chunks={CHUNKS},chunk_ms={args.chunk_ms:g}"],
                url=f"http://127.0.0.1:{up_port}", core=pin.driver, env=os.environ, cwd=ROOT,
            )  # fmt: skip
            svc.wait_ready(upstream, "/v1/models")
            config = workdir / "policy.yaml"
            config.write_text(policy(upstream.url, f"http://127.0.0.1:{sink_port}"))
            roots = {f"router (this checkout, {_commit()})": ROOT}
            if args.against is not None:
                roots[f"router ({args.against.name})"] = args.against.resolve()
            started = {
                name: launch_router(svc, f"router{i}", root, config, workdir, pin.server)
                for i, (name, root) in enumerate(roots.items())
            }
            for service in started.values():
                svc.wait_ready(service, "/readyz")
            lines = _run(drive(args, {name: s.url for name, s in started.items()}, sink_port))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Stall benchmark — {time.strftime('%Y-%m-%d %H:%M')}; machine: nproc {info['nproc']}, {info['cpu']}, "
          f"load average at start {info['loadavg']}; {pin.describe()}")  # fmt: skip
    print(f"{args.streams} small streams at once ({CHUNKS} chunks, {args.chunk_ms:g} ms apart); large bodies of "
          f"{args.big_mb:g} MB one after another, {args.pause:g} s apart; {args.rounds} x {args.duration:g} s a phase")  # fmt: skip
    print("| router | load | small requests | TTFT p50 / p99 / max ms | chunk gap p50 / p99 / max ms "
          "| longest wait p99 / max ms | requests that waited > 100 ms | large bodies answered (status); p50 / max s |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    entry(main)
