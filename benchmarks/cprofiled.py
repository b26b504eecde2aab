"""``python -m benchmarks.cprofiled OUT python -m MODULE ARGS...``: run MODULE under cProfile on demand.

The router's process as ``benchmarks.profile --cprofile`` starts it: the profiler is off until
SIGUSR1 (after the warm-up turns, so start-up and first-turn caches stay out of it) and SIGUSR2
writes what it gathered to OUT (``pstats``) and switches it off. Python 3.11's cProfile sees the
thread that switched it on: the main thread, which runs the event loop (the request path); the
log's writer and worker threads are not in it.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "-m":
        raise SystemExit("usage: python -m benchmarks.cprofiled OUT PYTHON -m MODULE [ARGS...]")
    out, module, args = argv[0], argv[3], argv[4:]
    profiler = cProfile.Profile()

    def on(signum: int, frame: FrameType | None) -> None:
        profiler.enable()

    def off(signum: int, frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
