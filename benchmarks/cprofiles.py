"""``python -m benchmarks.profile --cprofile``: the router's request path, function by function.

The router is started as the other benchmarks start it (the demo policy with a learned artifact,
SQLite log), inside ``benchmarks.cprofiled``; each mode (a replay scenario) is sent ``warmup``
turns, then the profiler is switched on (SIGUSR1) for ``turns`` more, sent one at a time, and
written out (SIGUSR2). cProfile adds its own cost to every call, so read the shares and the calls
a turn, not the seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks import scenarios
from benchmarks.loadgen import run_count
from benchmarks.procs import Pinning, Services
from benchmarks.report import ROUTER
from benchmarks.run import _run, start

#: Frames of these files are the router's own (grouped per module); others per package.
_OWN = "/router/"


def where(file: str) -> str:
    """A profiled function's home: ``router/x/y.py`` for the router's, else its package or
    stdlib module, ``C`` for builtins (cProfile files them under ``~``)."""
    if file == "~":
        return "C"
    path = file.replace("\\", "/")
    if _OWN in path and "site-packages" not in path:
        return "router/" + path.rsplit(_OWN, 1)[1]
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python" in path:  # the standard library: /usr/lib/python3.11/asyncio/events.py -> asyncio
        return path.rsplit("/lib/python", 1)[1].split("/")[1].removesuffix(".py")
    return path


def report(stats: pstats.Stats, mode: str, turns: int, top: int) -> str:
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in raw.values()) or 1.0
    calls = sum(nc for (_, nc, _, _, _) in raw.values())
    by_home: Counter[str] = Counter()
    calls_by_home: Counter[str] = Counter()
    for (file, _, _), (_, nc, tt, _, _) in raw.items():
        by_home[where(file)] += tt
        calls_by_home[where(file)] += nc
    funcs = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    lines = [
        f"== {mode}: {turns} turns at c=1, {calls / turns:,.0f} Python calls a turn (C builtins included), "
        f"{1000 * total / turns:.2f} ms own time a turn under the profiler",
        "Own time, functions (share, calls a turn, function):",
        *(
            f"  {v[2] / total:6.1%} {v[1] / turns:8.1f}  {func} ({where(file)}:{line})"
            for (file, line, func), v in funcs
        ),
        "Own time, router modules and packages (share, calls a turn):",
        *(f"  {t / total:6.1%} {calls_by_home[h] / turns:8.1f}  {h}" for h, t in by_home.most_common(top)),
    ]
    return "\n".join(lines)


async def _profile(url: str, pid: int, out: Path, mode: str, turns: int, warmup: int) -> None:
    call = scenarios.call(scenarios.SCENARIOS[mode], ROUTER)
    counter = itertools.count()
    if await run_count(url, call, 1, warmup, counter):
        raise SystemExit(f"{mode}: warm-up requests failed")
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(0.2)  # the handler runs when the loop next wakes: before the first counted turn
    errors = await run_count(url, call, 1, turns, counter)
    await asyncio.sleep(1.0)  # the last turn's work after its reply: its label, the log's batch
    os.kill(pid, signal.SIGUSR2)
    if errors:
        raise SystemExit(f"{mode}: {errors} of {turns} requests failed")


def main(modes: Sequence[str], turns: int, warmup: int, top: int, out_dir: Path) -> int:
    for mode in modes:
        if mode not in scenarios.SCENARIOS:
            raise SystemExit(f"unknown mode {mode!r}: from {', '.join(scenarios.SCENARIOS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="router-cprofile-"))
    reports = []
    try:
        for mode in modes:
            out = out_dir / f"cprofile-{mode}.pstats"
            out.unlink(missing_ok=True)

            def wrap(name: str, out: Path = out) -> list[str]:
                return [sys.executable, "-m", "benchmarks.cprofiled", str(out)] if name == ROUTER else []

            # A fresh router per mode: the conversation memo and the task tracker start empty.
            (workdir / mode).mkdir()
            with Services(workdir / mode) as svc:
                started = start(svc, Pinning(None, None), workdir / mode, with_litellm=False, wrap=wrap)
                router = started[ROUTER]
                print(f"profiling {mode}: {warmup} turns, then {turns}...", file=sys.stderr, flush=True)
                _run(_profile(router.url, router.pid, out, mode, turns, warmup))
                deadline = time.monotonic() + 30
                while not out.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not out.exists():
                    raise SystemExit(f"{mode}: the router wrote no profile: {router.log_tail()}")
                time.sleep(0.5)  # dump_stats may still be writing
            reports.append(report(pstats.Stats(str(out)), mode, turns, top))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"profiles in {out_dir} (python -m pstats FILE)")
    print("\n\n".join(reports))
    return 0
