"""``python -m benchmarks.run`` (``make bench``): the router under load, beside the upstream and LiteLLM.

Starts the fake upstream, the floor (issue 8's 40-line FastAPI + uvicorn + aiohttp pass-through,
``benchmarks/passthrough.py``), the router (``router serve`` on the demo policy with a learned
artifact (``benchmarks/learned.py``), SQLite log in a temp dir, metrics on) and LiteLLM's proxy against the same upstream, all on 127.0.0.1; pins the
server under test to one core and the load generator and upstream to the other; drives every
scenario at each concurrency against the upstream directly (the baseline), the floor, the router
and LiteLLM, one after the other; then measures the router's memory after 10,000 requests and runs the routing
microbenchmark. Prints one table with the ratios, and stops everything it started, also on
Ctrl-C and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import learned, litellm_proxy, passthrough, replay, routing, scenarios
from benchmarks.loadgen import CellResult, run_cell, run_count
from benchmarks.procs import (
    Pinning,
    Service,
    Services,
    choose_pinning,
    cpu_seconds,
    free_port,
    machine,
    rss_bytes,
    runqueue_wait_seconds,
    steal_seconds,
)
from benchmarks.replay import Replay
from benchmarks.report import LITELLM, PASSTHROUGH, ROUTER, UPSTREAM, Row, summary, table
from benchmarks.scenarios import Scenario

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

NOTE = (
    "The machine is shared and noisy (other work runs on it): compare rows of the same run, not runs "
    "of different days; rerun a surprising cell before believing it."
)
LEGEND = """\
Columns: req/s, latency p50/p99 (ms, whole response) and TTFT p50/p99 (ms to the first content byte of a
stream) as seen by the load generator. CPU ms/req and CPU % are the server's own process (for upstream
rows, the upstream itself) over the measured window. CPU wait % is the time the server's main thread (its
event loop) was runnable but waiting for a CPU that another process held: high means the cell was
disturbed by other work on the machine (in upstream rows the load generator shares the core by design).
Steal % is the machine's CPU time (both cores) that the hypervisor gave to other guests: high means the
host was busy elsewhere and the cell's CPU times and latencies are inflated.
Driver core % is the load generator plus the upstream on the other core (near 100% means the driver,
not the server, limits throughput: expected in upstream rows only). +p50 and +TTFT p50 are added to the
upstream row of the same cell; ÷ LiteLLM is the router's req/s over LiteLLM's in that cell. The floor
rows are what the framework, the server and the HTTP client alone cost on this machine."""


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...]
    concurrency: tuple[int, ...]
    duration_s: float
    warmup_s: float
    memory_requests: int

    def levels(self, sc: Scenario) -> tuple[int, ...]:
        if sc.concurrency is None:
            return self.concurrency
        return tuple(c for c in sc.concurrency if c in self.concurrency) or self.concurrency[:1]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="a smoke run: short cells, concurrency 1 and 16")
    p.add_argument("--duration", type=float, help="measured seconds per cell (default 3; quick 0.5)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per cell (default 0.5; quick 0.2)")
    p.add_argument("--concurrency", help="comma-separated levels (default 1,16,64; quick 1,16)")
    p.add_argument("--scenarios", default=",".join(scenarios.SCENARIOS),
                   help=f"comma-separated, from: {', '.join(scenarios.SCENARIOS)}")  # fmt: skip
    p.add_argument(
        "--memory-requests", type=int, help="router requests before the RSS reading (default 10000)"
    )
    p.add_argument("--no-litellm", action="store_true", help="skip LiteLLM's proxy (no install either)")
    p.add_argument("--no-floor", action="store_true", help="skip the 40-line pass-through (the floor)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    p.add_argument("--no-routing", action="store_true", help="skip the routing microbenchmark")
    p.add_argument("--json", type=Path, help="also write every number here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, router.db)")
    p.add_argument("--redis", metavar="URL",
                   help="the router keeps its shared state in this Redis, as replicas do (a key prefix of its own)")  # fmt: skip
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in scenarios.SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s): {', '.join(unknown)}")
    chosen = tuple(scenarios.SCENARIOS[n] for n in names)
    levels = args.concurrency or ("1,16" if args.quick else "1,16,64")
    concurrency = tuple(int(c) for c in levels.split(",") if c)
    if args.quick and args.concurrency is None:
        # Agent-sized and translated rows once each: they are the slow ones.
        chosen = tuple(dataclasses.replace(s, concurrency=(1,)) if s.concurrency else s for s in chosen)
    return Plan(
        scenarios=chosen,
        concurrency=concurrency,
        duration_s=args.duration if args.duration is not None else (0.5 if args.quick else 3.0),
        warmup_s=args.warmup if args.warmup is not None else (0.2 if args.quick else 0.5),
        memory_requests=args.memory_requests if args.memory_requests is not None else (1000 if args.quick else 10_000),
    )  # fmt: skip


def start(
    svc: Services,
    pin: Pinning,
    workdir: Path,
    with_litellm: bool,
    with_floor: bool = False,
    router_env: Mapping[str, str] | None = None,
    wrap: Callable[[str], list[str]] | None = None,
    ready_timeout_s: float = 90.0,
) -> dict[str, Service]:
    """Upstream first (the others point at it), then the pass-through, the router and LiteLLM.
    ``router_env``: settings for the router (``ROUTER_*``; the caller's own are not passed on);
    ``wrap``: a command prefix for the floor and the router, by name (``benchmarks.instructions``
    runs them under valgrind)."""
    prefix = wrap or (lambda name: [])
    up_port = free_port()
    up_url = f"http://127.0.0.1:{up_port}"
    upstream = svc.launch(
        UPSTREAM,
        [sys.executable, "-m", "router.fakeupstream", "--host", "127.0.0.1", "--port", str(up_port),
         "--behaviour", f"chunks={scenarios.CHUNKS}"],
        url=up_url, core=pin.driver, env=os.environ, cwd=ROOT,
    )  # fmt: skip
    svc.wait_ready(upstream, "/v1/models")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTER_", "OTEL_"))}
    floor: Service | None = None
    if with_floor:
        port = free_port()
        floor = svc.launch(
            PASSTHROUGH,
            [*prefix(PASSTHROUGH), sys.executable, "-m", "uvicorn", "benchmarks.passthrough:app", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning", "--no-access-log"],
            url=f"http://127.0.0.1:{port}", core=pin.server, env={**env, passthrough.UPSTREAM_ENV: up_url}, cwd=ROOT,
        )  # fmt: skip
    env.update(
        ROUTER_LOCAL_UPSTREAM=up_url,
        ROUTER_DRAIN_DELAY="0",
        ROUTER_DRAIN_TIMEOUT="5",
        # Steady state: litellm's background import would share the cores with the first seconds.
        ROUTER_PRELOAD="1",
        **(router_env or {}),
    )
    policy = learned.write(workdir / "policy")
    port = free_port()
    router = svc.launch(
        ROUTER,
        [*prefix(ROUTER), sys.executable, "-m", "router.app.cli", "serve", "--config", str(policy), "--host", "127.0.0.1",
         "--port", str(port), "--store", f"sqlite:///{workdir / 'router.db'}", "--log-level", "warning"],
        url=f"http://127.0.0.1:{port}", core=pin.server, env=env, cwd=ROOT,
    )  # fmt: skip
    started = {UPSTREAM: upstream, **({PASSTHROUGH: floor} if floor else {}), ROUTER: router}
    if with_litellm:
        port = free_port()
        config = litellm_proxy.write_config(workdir / "litellm.yaml", up_url)
        started[LITELLM] = svc.launch(
            LITELLM, litellm_proxy.argv(config, port), url=f"http://127.0.0.1:{port}", core=pin.server,
            env=litellm_proxy.environment(os.environ), cwd=workdir,
        )  # fmt: skip
    svc.wait_ready(router, "/readyz", ready_timeout_s)
    if floor is not None:
        svc.wait_ready(floor, "/openapi.json", ready_timeout_s)
    if with_litellm:
        svc.wait_ready(started[LITELLM], "/health/liveliness", timeout_s=180)
    return started


def shared_state(redis: str | None, workdir: Path) -> dict[str, str]:
    """The router's settings for keeping its shared state in ``redis`` (None: in process), under
    a key prefix of this run's own."""
    return {"ROUTER_REDIS_URL": redis, "ROUTER_REDIS_PREFIX": f"{workdir.name}:"} if redis else {}


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def prompt_counts(url: str) -> dict[str, float]:
    """The router's prompt-sizing counters: memo hits and misses, exact counts before deciding."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    out = {"hit": 0.0, "miss": 0.0, "counted": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "router_prompt_memo_total":
                out[sample.labels["result"]] = sample.value
            elif sample.name == "router_prompt_counted_before_decision_total":
                out["counted"] = sample.value
    return out


@dataclass
class ReplayStats:
    """What the replay scenarios sent, and what the router's conversation memo made of it."""

    replays: dict[str, list[Replay]] = field(default_factory=dict)
    prompt: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, scenario: str, before: dict[str, float], after: dict[str, float]) -> None:
        total = self.prompt.setdefault(scenario, {"hit": 0.0, "miss": 0.0, "counted": 0.0})
        for k in total:
            total[k] += after[k] - before[k]

    def render(self) -> str:
        lines = ["Replay scenarios (real agent runs, turn by turn):"]
        for name, played in self.replays.items():
            lines.append(f"  {name}: {replay.describe(played)}")
            p = self.prompt.get(name)
            if p and (n := p["hit"] + p["miss"]):
                lines.append(
                    f"    router: conversation memo hit rate {p['hit'] / n:.1%} of {n:,.0f} requests; "
                    f"exact token count needed before deciding on {p['counted'] / n:.1%}"
                )
        return "\n".join(lines)


async def drive(
    plan: Plan, services: dict[str, Service], memory: dict[str, Any], played: ReplayStats
) -> list[Row]:
    counters = {name: itertools.count() for name in services}
    up = services[UPSTREAM]

    def probes(target: str) -> dict[str, Any]:
        server = services[target]
        return {
            "server": lambda: cpu_seconds(server.pid),
            "server_wait": lambda: runqueue_wait_seconds(server.pid),
            "steal": steal_seconds,
            "upstream": lambda: cpu_seconds(up.pid),
        }

    # One short pass per scenario and target first: lazy imports and connection pools are paid here.
    for sc in plan.scenarios:
        for target, service in services.items():
            if target in sc.models:
                await run_cell(service.url, scenarios.call(sc, target), 2, 0.2, 0.1, {}, counters[target])
    rows: list[Row] = []
    for sc in plan.scenarios:
        for c in plan.levels(sc):
            for target, service in services.items():
                if target not in sc.models:
                    continue  # the pass-through cannot translate
                call = scenarios.call(sc, target)
                counted = sc.replay and target == ROUTER
                before = await prompt_counts(service.url) if counted else {}
                result = await run_cell(
                    service.url, call, c, plan.duration_s, plan.warmup_s, probes(target), counters[target],
                )  # fmt: skip
                if counted:
                    played.add(sc.name, before, await prompt_counts(service.url))
                if isinstance(call.body, Replay):
                    played.replays.setdefault(sc.name, []).append(call.body)
                rows.append(Row(sc.name, c, target, result))
                _progress(_cell_line(sc.name, c, target, result))
    router = services[ROUTER]
    sent = next(counters[ROUTER])
    if sent < plan.memory_requests:
        chat = scenarios.call(scenarios.SCENARIOS["chat"], ROUTER)
        _progress(f"memory: {plan.memory_requests - sent} more router requests (chat, c=16)...")
        errors = await run_count(router.url, chat, 16, plan.memory_requests - sent, counters[ROUTER])
        memory["top_up_errors"] = errors
        sent = plan.memory_requests
    await asyncio.sleep(1.0)  # let the batched log writer drain
    memory["requests"] = sent
    memory["rss_after"] = rss_bytes(router.pid)
    return rows


def _cell_line(scenario: str, c: int, target: str, r: CellResult) -> str:
    row = Row(scenario, c, target, r)
    ttft = f" TTFT p50 {row.ttft50:.2f} ms" if r.ttfts_ms else ""
    return (
        f"  {scenario:<18} c={c:<3} {target:<8} {r.rps:8.0f} req/s  p50 {row.p50:7.2f} ms{ttft}"
        f"  cpu {row.cpu_ms_per_request:6.2f} ms/req  errors {r.errors}"
        + (f" (first: {r.first_error})" if r.first_error else "")
    )


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop  # the generator must not be the bottleneck: uvloop costs less per request

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def handle_interrupts() -> None:
    """Ctrl-C and SIGTERM unwind the run (stopping every service), even for a background job,
    which starts with SIGINT ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)


def entry(main: Callable[[], int]) -> NoReturn:
    """A benchmark's ``__main__``: exit with ``main()``'s code, or 130 once Ctrl-C (or SIGTERM,
    see ``handle_interrupts``) has unwound it and stopped what it started."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        sys.exit(130)


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def header(
    info: dict[str, str], pin: Pinning, plan: Plan, litellm_version: str | None, redis: str | None = None
) -> str:
    lines = [
        f"Router benchmark — {time.strftime('%Y-%m-%d %H:%M')} — commit {_commit()}",
        f"Machine: nproc {info['nproc']}, {info['cpu']}; load average at start {info['loadavg']}",
        f"Pinning: {pin.describe()}",
        f"Note: {NOTE}",
        f"Upstream: router.fakeupstream (aiohttp + uvloop), {scenarios.CHUNKS} chunks per stream, no delays",
        "Floor: benchmarks/passthrough.py, issue 8's 40-line FastAPI + uvicorn + aiohttp pass-through "
        "(no parsing, routing, log or metrics; not for translated rows)",
        "Router: `router serve` on policies/examples/local.yaml with a learned artifact (benchmarks/learned.py), "
        "one process, SQLite request log (temp dir), metrics on, open mode, "
        + (f"shared state in Redis at {redis}" if redis else "state in process"),
        "LiteLLM: "
        + (
            f"litellm {litellm_version} proxy, --num_workers 1, no DB, no callbacks, no master key"
            if litellm_version
            else "skipped"
        ),
        f"Cells: {plan.duration_s:g} s measured after {plan.warmup_s:g} s warm-up each; closed loop; "
        "each request distinct (64 tasks; 16 for agent-sized)",
    ]
    lines += [f"  {sc.name}: {sc.description}" for sc in plan.scenarios]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    info = machine()
    pin = choose_pinning(not args.no_pin)
    handle_interrupts()
    litellm_version = None
    if not args.no_litellm:
        litellm_proxy.ensure_installed()
        litellm_version = litellm_proxy.version()
    if pin.driver is not None:
        os.sched_setaffinity(0, {pin.driver})
    workdir = Path(tempfile.mkdtemp(prefix="router-bench-"))
    memory: dict[str, Any] = {}
    played = ReplayStats()
    try:
        with Services(workdir) as svc:
            _progress(
                "starting the upstream, the pass-through, the router"
                + ("" if args.no_litellm else " and LiteLLM's proxy")
                + "..."
            )
            services = start(svc, pin, workdir, not args.no_litellm, not args.no_floor,
                             router_env=shared_state(args.redis, workdir))  # fmt: skip
            memory["rss_start"] = rss_bytes(services[ROUTER].pid)
            rows = _run(drive(plan, services, memory, played))
        info_end = machine()
        cases = [] if args.no_routing else routing.run(budget_s=0.2 if args.quick else 1.5)
    finally:
        if args.keep:
            _progress(f"logs and router.db kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    out = [
        header(info, pin, plan, litellm_version, args.redis),
        "",
        table(rows),
        LEGEND,
        "",
        summary(rows),
        "",
        *([played.render(), ""] if played.replays else []),
        f"Memory (router RSS): {memory['rss_start'] / 2**20:.0f} MiB at start (ready, before any request) → "
        f"{memory['rss_after'] / 2**20:.0f} MiB after {memory['requests']:,} requests",
        f"Load average at end: {info_end['loadavg']}",
    ]
    if cases:
        out += ["", routing.render(cases)]
    print("\n".join(out))
    if args.json:
        doc = {"machine": info, "loadavg_end": info_end["loadavg"], "pinning": pin.describe(),
               "litellm": litellm_version, "rows": [r.as_dict() for r in rows], "memory": memory,
               "routing": [c.as_dict() for c in cases]}  # fmt: skip
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    # LiteLLM's failures are its own (reported in the table); the router's or the baseline's fail the run.
    return 1 if any(r.result.errors for r in rows if r.target != LITELLM) else 0


if __name__ == "__main__":
    entry(main)
