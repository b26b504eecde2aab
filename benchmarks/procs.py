"""The processes a benchmark starts: pinned to cores, watched through /proc, always stopped.

Each service runs in a session of its own, so stopping it reaches any worker it forked and
nothing else. ``Services`` is a context manager: leaving it (normally, on an error or on
Ctrl-C) stops everything it started.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_TICKS = os.sysconf("SC_CLK_TCK")
_STOP_GRACE_S = 5.0


class StartError(RuntimeError):
    """A service exited or did not become ready; the message carries the end of its log."""


@dataclass(frozen=True, slots=True)
class Pinning:
    """Which core runs the server under test and which runs the driver (load generator + upstream)."""

    server: int | None
    driver: int | None

    @property
    def active(self) -> bool:
        return self.server is not None

    def describe(self) -> str:
        if not self.active:
            return "not pinned (taskset missing, fewer than 2 cores, or --no-pin)"
        return f"server under test on core {self.server}; load generator and upstream on core {self.driver}"


def choose_pinning(enabled: bool) -> Pinning:
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2 or shutil.which("taskset") is None:
        return Pinning(None, None)
    return Pinning(cores[0], cores[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    core: int | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Services:
    """Starts services and stops all of them on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._started: list[Service] = []

    def __enter__(self) -> Services:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def launch(
        self,
        name: str,
        argv: Sequence[str],
        *,
        url: str,
        core: int | None,
        env: Mapping[str, str],
        cwd: Path,
    ) -> Service:
        """Start a service without waiting for it (see ``wait_ready``)."""
        log_path = self.workdir / f"{name}.log"
        command = [*(["taskset", "-c", str(core)] if core is not None else []), *argv]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env), cwd=cwd, start_new_session=True,
            )  # fmt: skip
        service = Service(name, proc, url, log_path, core)
        self._started.append(service)
        return service

    @staticmethod
    def wait_ready(service: Service, ready_path: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if service.proc.poll() is not None:
                raise StartError(
                    f"{service.name} exited with {service.proc.returncode}:\n{service.log_tail()}"
                )
            if _answers(service.url + ready_path):
                return
            time.sleep(0.1)
        raise StartError(f"{service.name} not ready after {timeout_s:.0f}s:\n{service.log_tail()}")

    def stop(self, service: Service) -> None:
        if service.proc.poll() is None:
            _signal_group(service.pid, signal.SIGTERM)
            try:
                service.proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(service.pid, signal.SIGKILL)
                service.proc.wait(_STOP_GRACE_S)
        if service in self._started:
            self._started.remove(service)

    def stop_all(self) -> None:
        for service in reversed(list(self._started)):
            try:
                self.stop(service)
            except Exception as exc:  # keep stopping the others
                print(f"warning: could not stop {service.name} (pid {service.pid}): {exc}")


def _signal_group(pid: int, sig: int) -> None:
    # The service leads its own session (start_new_session), so its group id is its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(200 <= resp.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(c) for c in text.split())
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (a server may fork workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants, all threads included."""
    total = 0
    for p in process_tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) start at field 3; utime is 14, stime 15.
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def runqueue_wait_seconds(pid: int) -> float:
    """Time the main thread of each process in the tree spent runnable but waiting for a CPU.

    Main threads only: an exited thread's counters vanish from /proc, so a sum over all threads
    could go down between two readings. The event loop runs on the main thread anyway.
    """
    total = 0
    for p in process_tree(pid):
        try:
            total += int(Path(f"/proc/{p}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests while this VM's CPUs wanted it (all CPUs).

    A virtual machine's processes never see it as their own: a cell measured while the host was
    busy elsewhere shows high steal, and its CPU-per-request and latency are inflated.
    """
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / _TICKS  # cpu user nice system idle iowait irq softirq steal
    except (OSError, IndexError, ValueError):
        return math.nan


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants."""
    total = 0
    for p in process_tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = "unknown"
    with contextlib.suppress(OSError):
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {"nproc": str(os.cpu_count() or 0), "cpu": model, "loadavg": load}
