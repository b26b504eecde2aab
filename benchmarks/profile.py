"""``python -m benchmarks.profile``: where the router's CPU goes under load, sampled with py-spy,
or (``--cprofile``) function by function over replayed agent turns.

Starts the fake upstream and the router as the load benchmark does (pinned, demo policy with a
learned artifact, SQLite log), drives each mode at concurrency 16 (``--concurrency``) and samples the router with ``py-spy record`` meanwhile
(idle threads excluded, so shares are of busy CPU). Writes per mode the collapsed stacks
(``profile-MODE.txt``: load into speedscope or any flamegraph tool) and, unless ``--no-svg``, a
flamegraph from a second pass (``profile-MODE.svg``); prints the hottest functions by their own
time, the share per package, and the router's functions by inclusive time. Needs py-spy in the
virtualenv (``.venv/bin/pip install py-spy``) and permission to ptrace (root, or
``kernel.yama.ptrace_scope=0``).

``--cprofile`` needs neither: the router runs under cProfile (``benchmarks.cprofiled``), switched on
after ``--warmup`` replayed turns and written out after ``--turns`` more, sent one at a time as
``benchmarks.instructions`` sends them (``--modes replay``, the default for it); prints the Python
calls a turn, the functions with the most own time, and the own time per router module and per
package. It sees the event loop's thread only (the request path; not the log's writer thread).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import cprofiles, scenarios
from benchmarks.loadgen import CellResult, run_cell
from benchmarks.procs import Service, Services, choose_pinning, cpu_seconds
from benchmarks.report import ROUTER, UPSTREAM
from benchmarks.run import ROOT, _run, entry, handle_interrupts, start

MODES = ("chat", "chat-stream")
#: Leaf frames of threads blocked in C waiting for work: py-spy cannot tell those from busy ones.
IDLE_LEAVES = frozenset(
    {
        "_worker (concurrent/futures/thread.py)",
        "wait (threading.py)",
        "select (selectors.py)",
        "get (queue.py)",
    }
)
#: Frames every sample of the serving thread passes through: not worth listing.
_ENTRY_FILES = ("(router/app/cli.py)", "(router/app/serve.py)")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass
class Profile:
    samples: int
    #: Samples dropped as idle (a pool thread waiting for work).
    idle: int
    self_time: Counter[str]
    inclusive: Counter[str]
    packages: Counter[str]


def _frame_key(frame: str) -> tuple[str, str]:
    """(``function (file)``, package) of a py-spy frame ``function (file:line)``."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip(), "?"
    file = m.group("file")
    return f"{m.group('func')} ({file})", package(file)


def package(file: str) -> str:
    """The top-level package (or stdlib module) a shortened py-spy file name belongs to."""
    parts = file.replace("\\", "/").split("/")
    if (
        parts[0] in ("asyncio", "concurrent", "json", "logging", "email", "http", "urllib", "sqlite3")
        or len(parts) == 1
    ):
        return parts[0].removesuffix(".py")
    return parts[0]


def parse_collapsed(text: str) -> Profile:
    """Aggregate py-spy's raw output (``frame;frame;... count`` per line, outermost first)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = idle = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        keys = [_frame_key(f) for f in frames]
        leaf, leaf_package = keys[-1]
        if leaf in IDLE_LEAVES:
            idle += count
            continue
        total += count
        self_time[leaf] += count
        packages[leaf_package] += count
        for key in {k for k, _ in keys}:
            inclusive[key] += count
    return Profile(total, idle, self_time, inclusive, packages)


def render(
    mode: str, profile: Profile, result: CellResult, cpu_ms: float, concurrency: int, top: int = 15
) -> str:
    n = profile.samples or 1
    lines = [
        f"== {mode}, concurrency {concurrency}: {result.rps:,.0f} req/s, {cpu_ms:.2f} ms CPU/req while sampled; "
        f"{profile.samples} busy samples ({profile.idle} idle pool-thread samples dropped)",
        "Own time (leaf frames):",
        *(f"  {c / n:6.1%}  {k}" for k, c in profile.self_time.most_common(top)),
        "Own time by package:",
        *(f"  {c / n:6.1%}  {k}" for k, c in profile.packages.most_common(12)),
        "Inclusive time, the router's own functions:",
        *(
            f"  {c / n:6.1%}  {k}"
            for k, c in [
                (k, c)
                for k, c in profile.inclusive.most_common()
                if "(router/" in k and not k.endswith(_ENTRY_FILES)
            ][:top]
        ),
    ]
    return "\n".join(lines)


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


async def _sample(pid: int, out: Path, fmt: str, seconds: float, rate: int, flags: Sequence[str]) -> None:
    proc = await asyncio.create_subprocess_exec(
        _py_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(rate),
        "--format", fmt, "--output", str(out), "--function", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    text, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(
            f"py-spy could not sample pid {pid} (exit {proc.returncode}): {text.decode(errors='replace')[-500:]}\n"
            "If ptrace is not permitted here, profile in-process instead: "
            "python -m cProfile -o router.prof -m router.app.cli serve ..."
        )


async def profile_mode(
    router: Service,
    upstream: Service,
    mode: str,
    out: Path,
    seconds: float,
    rate: int,
    svg: bool,
    flags: Sequence[str],
    concurrency: int,
) -> str:
    call = scenarios.call(scenarios.SCENARIOS[mode], ROUTER)
    counter = itertools.count()
    url, pid = router.url, router.pid
    probes = {"server": lambda: cpu_seconds(pid), "upstream": lambda: cpu_seconds(upstream.pid)}
    raw = out / f"profile-{mode}.txt"
    load = asyncio.create_task(run_cell(url, call, concurrency, seconds + 0.5, 1.0, probes, counter))
    await asyncio.sleep(1.0)
    await _sample(pid, raw, "raw", seconds, rate, flags)
    result = await load
    if svg:
        load = asyncio.create_task(run_cell(url, call, concurrency, seconds + 0.5, 0.5, {}, counter))
        await asyncio.sleep(0.5)
        await _sample(pid, out / f"profile-{mode}.svg", "flamegraph", seconds, rate, flags)
        await load
    cpu_ms = result.cpu_s["server"] * 1000 / result.requests if result.requests else float("nan")
    return render(mode, parse_collapsed(raw.read_text()), result, cpu_ms, concurrency)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--seconds", type=float, default=8.0, help="sampling time per mode")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--modes", default=",".join(MODES), help=f"from: {', '.join(scenarios.SCENARIOS)}")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where profiles go")
    p.add_argument("--no-svg", action="store_true", help="skip the flamegraph pass")
    p.add_argument("--native", action="store_true", help="include C frames (slower sampling)")
    p.add_argument("--gil", action="store_true", help="only samples holding the GIL (Python CPU only)")
    p.add_argument("--cprofile", action="store_true", help="cProfile replayed turns at c=1 (no py-spy)")
    p.add_argument("--turns", type=int, default=300, help="--cprofile: profiled turns")
    p.add_argument("--warmup", type=int, default=40, help="--cprofile: turns sent first, not profiled")
    p.add_argument("--top", type=int, default=25, help="--cprofile: functions listed")
    args = p.parse_args(argv)
    if args.cprofile:
        modes = args.modes if args.modes != ",".join(MODES) else "replay"
        return cprofiles.main(modes.split(","), args.turns, args.warmup, args.top, args.out)
    _py_spy()
    args.out.mkdir(parents=True, exist_ok=True)
    handle_interrupts()
    flags = [*(["--native"] if args.native else []), *(["--gil"] if args.gil else [])]
    pin = choose_pinning(True)
    if pin.driver is not None:
        os.sched_setaffinity(0, {pin.driver})
    workdir = Path(tempfile.mkdtemp(prefix="router-profile-"))
    reports: list[str] = []
    try:
        with Services(workdir) as svc:
            services = start(svc, pin, workdir, with_litellm=False)
            router, upstream = services[ROUTER], services[UPSTREAM]
            for mode in args.modes.split(","):
                print(f"profiling {mode} for {args.seconds:g} s...", file=sys.stderr, flush=True)
                job = profile_mode(
                    router,
                    upstream,
                    mode,
                    args.out,
                    args.seconds,
                    args.rate,
                    not args.no_svg,
                    flags,
                    args.concurrency,
                )
                reports.append(_run(job))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Pinning: {pin.describe()}; profiles in {args.out}")
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    entry(main)
