"""``python -m benchmarks.instructions``: instructions per replayed turn, router vs floor, under callgrind.

CPU seconds on a shared 2-core machine move with whatever else runs there (caches, the other
core's load, the hypervisor); counted instructions hardly do (two runs agree to 0.5 %). This starts
the services as ``benchmarks.run`` does, but the floor and the router under ``valgrind
--tool=callgrind`` with counting off (``--instr-atstart=no``); warms each up with the same replayed
turns (``benchmarks.replay``), switches counting on (``callgrind_control -i on``) for a fixed
sequence of turns sent one at a time, and prints the instructions each server executed per turn
(every thread: the loop, the log's, token counting) and their ratio.

What it does not see: time in the kernel (sockets, thread wake-ups, ~10 % of the router's CPU a
turn), and instructions are not all equally fast (valgrind emulates SHA-256 without the CPU's SHA
extensions, for one). So it judges a change to the router's own Python; the CPU figures of
``benchmarks.run`` remain the measure of the targets. Slow (valgrind runs Python ~50× slower):
about 1.5 minutes for the defaults. Needs valgrind (``apt-get install valgrind``); ``--keep``
leaves the callgrind files for ``callgrind_annotate``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import scenarios
from benchmarks.loadgen import run_count
from benchmarks.procs import Pinning, Service, Services
from benchmarks.report import PASSTHROUGH, ROUTER
from benchmarks.run import _run, entry, handle_interrupts, shared_state, start

_TOTALS = re.compile(rb"^totals:\s*(\d+)", re.M)
#: Valgrind runs the servers ~50× slower: starting takes a minute, not a second.
_READY_TIMEOUT_S = 900.0


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _outputs(out: Path) -> list[Path]:
    return sorted(out.parent.glob(out.name + "*"))


def instructions(out: Path) -> int:
    """The instructions counted in a service's callgrind files (the dumps and the final one)."""
    total = 0
    for path in _outputs(out):
        m = _TOTALS.search(path.read_bytes())
        total += int(m.group(1)) if m else 0
    return total


async def measure(service: Service, out: Path, target: str, scenario: str, warmup: int, turns: int) -> int:
    """Instructions the service executed for ``turns`` turns after ``warmup`` uncounted ones."""
    for old in _outputs(out):
        old.unlink()
    call = scenarios.call(scenarios.SCENARIOS[scenario], target)
    counter = itertools.count()
    await run_count(service.url, call, 1, warmup, counter)
    _control(service.pid, "--zero")
    _control(service.pid, "--instr=on")
    errors = await run_count(service.url, call, 1, turns, counter)
    await asyncio.sleep(1.0)  # the last turn's work after its reply: its label, the log's batch
    _control(service.pid, "--instr=off")
    _control(service.pid, "--dump")
    if errors:
        raise SystemExit(f"{target}: {errors} of {turns} requests failed")
    return instructions(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--scenarios", default="replay,replay-anthropic", help="comma-separated replay scenarios")
    p.add_argument("--turns", type=int, default=150, help="counted turns per target and scenario")
    p.add_argument("--warmup", type=int, default=40, help="turns sent first, not counted")
    p.add_argument("--no-floor", action="store_true", help="count the router only")
    p.add_argument("--keep", action="store_true", help="keep the callgrind files (for callgrind_annotate)")
    p.add_argument(
        "--redis", metavar="URL", help="the router keeps its shared state in this Redis, as replicas do"
    )
    args = p.parse_args(argv)
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install valgrind)")
    handle_interrupts()
    workdir = Path(tempfile.mkdtemp(prefix="router-instr-"))
    outs = {name: workdir / f"{name}.callgrind" for name in (PASSTHROUGH, ROUTER)}

    def wrap(name: str) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={outs[name]}"]

    lines = []
    try:
        with Services(workdir) as svc:
            # Not pinned: counts do not depend on the core, and valgrind serialises threads anyway.
            started = start(svc, Pinning(None, None), workdir, with_litellm=False,
                            with_floor=not args.no_floor, wrap=wrap, ready_timeout_s=_READY_TIMEOUT_S,
                            router_env=shared_state(args.redis, workdir))  # fmt: skip
            targets = [t for t in (PASSTHROUGH, ROUTER) if t in started]
            for sc in args.scenarios.split(","):
                per_turn = {}
                for name in targets:
                    total = _run(measure(started[name], outs[name], name, sc, args.warmup, args.turns))
                    per_turn[name] = total / args.turns
                    print(f"  {sc} {name}: {per_turn[name] / 1e6:,.2f} M instructions/turn", file=sys.stderr)
                ratio = (
                    f"; router/floor {per_turn[ROUTER] / per_turn[PASSTHROUGH]:.2f}×"
                    if len(per_turn) == 2
                    else ""
                )
                counts = ", ".join(f"{n} {v / 1e6:,.2f} M" for n, v in per_turn.items())
                lines.append(f"{sc}: {counts} instructions per turn over {args.turns} turns{ratio}")
    finally:
        if args.keep:
            print(f"callgrind files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    entry(main)
