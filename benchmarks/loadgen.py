"""A closed-loop load generator: N workers, each sending its next request when the last one ends.

Each cell runs a warm-up (connections opened, lazy imports paid, the server's queue filled), then
a measured window: the requests that complete inside it are counted, and their latencies kept.
The window lasts the cell's duration, stretched (up to three times, plus 2 s) until at least one
request per worker has completed, so a slow server still gets a fair sample. The server's CPU
time (from /proc) and the generator's own are read at the window's edges; when it closes, the
requests in flight are let finish, so the next cell starts on an idle server. A request counts as an error unless it gets a
200 and a complete reply: a JSON body with usage, or a stream that carries content and its
protocol's final event. For streams, TTFT is the time to the first byte of content (the first
text delta), not to the first byte of the response.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from benchmarks.bodies import Template
from benchmarks.procs import own_cpu_seconds
from benchmarks.replay import Replay

#: The first text delta of an OpenAI chat stream (the role-only first chunk has ``"content":""``).
OPENAI_CONTENT = re.compile(rb'"content":\s?"[^"]')
#: The first content event of an Anthropic stream.
ANTHROPIC_CONTENT = re.compile(rb"content_block_delta")
_DRAIN_S = 60.0  # how long the requests in flight at the window's end may take to finish
_MARKER_SPAN = 64  # bytes kept from the previous chunk so a marker split across chunks is found


@dataclass(frozen=True, slots=True)
class Call:
    """What one scenario sends to one target."""

    path: str
    headers: Mapping[str, str]
    body: Template | Replay
    stream: bool
    #: Found in the first content chunk of a stream.
    content: re.Pattern[bytes] | None = None
    #: The stream's final event.
    end: bytes = b""
    #: Distinct tasks the requests are spread over (each task's conversation repeats, its last turn differs).
    tasks: int = 64

    def next_body(self, worker: int, n: int) -> bytes:
        if isinstance(self.body, Replay):  # real conversations, each worker replaying its own
            return self.body.next(worker, n)
        return self.body.render(n % self.tasks, n)


@dataclass
class CellResult:
    requests: int = 0
    errors: int = 0
    window_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    ttfts_ms: list[float] = field(default_factory=list)
    #: CPU seconds over the window per probe ("server", "upstream", "generator").
    cpu_s: dict[str, float] = field(default_factory=dict)
    first_error: str | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.window_s if self.window_s else 0.0


@dataclass
class _Window:
    start: float = float("inf")
    closed: bool = False


async def run_cell(
    base_url: str,
    call: Call,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    cpu_probes: Mapping[str, Callable[[], float]],
    counter: itertools.count[int],
) -> CellResult:
    """Drive ``call`` at ``concurrency`` for ``warmup_s`` + ``duration_s``; measure the window.

    ``cpu_probes`` name the processes whose CPU time to read (the generator's own is added).
    """
    result = CellResult()
    window = _Window()
    enough = asyncio.Event()  # one completion per worker: the least a window may count
    probes = {**cpu_probes, "generator": own_cpu_seconds}
    url = base_url + call.path
    connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
    ) as session:

        async def worker(w: int) -> None:
            while not window.closed:
                n = next(counter)
                body = call.next_body(w, n)
                started = time.perf_counter()
                ok, ttft, error = await _one(session, url, call, body, started)
                ended = time.perf_counter()
                if ended < window.start or window.closed:
                    continue
                result.requests += 1
                if result.requests >= concurrency:
                    enough.set()
                if not ok:
                    result.errors += 1
                    result.first_error = result.first_error or error
                    continue
                result.latencies_ms.append((ended - started) * 1000)
                if ttft is not None:
                    result.ttfts_ms.append(ttft * 1000)

        workers = [asyncio.create_task(worker(w)) for w in range(concurrency)]
        try:
            await asyncio.sleep(warmup_s)
            cpu0 = _read(probes)
            window.start = time.perf_counter()
            await asyncio.sleep(duration_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), timeout=duration_s * 2 + 2)
            end = time.perf_counter()
            cpu1 = _read(probes)
            window.closed = True
            await asyncio.wait(workers, timeout=_DRAIN_S)
        finally:
            for w in workers:
                w.cancel()
    result.window_s = end - window.start
    result.cpu_s = {name: cpu1[name] - cpu0[name] for name in probes}
    return result


def _read(probes: Mapping[str, Callable[[], float]]) -> dict[str, float]:
    return {name: probe() for name, probe in probes.items()}


async def _one(
    session: aiohttp.ClientSession, url: str, call: Call, body: bytes, started: float
) -> tuple[bool, float | None, str | None]:
    """Send one request; (complete and well-formed, TTFT in seconds if streamed, error text)."""
    try:
        async with session.post(url, data=body, headers=call.headers) as resp:
            if not call.stream:
                raw = await resp.read()
                if resp.status != 200 or b'"usage"' not in raw:
                    return False, None, f"HTTP {resp.status}: {raw[:200]!r}"
                return True, None, None
            ttft: float | None = None
            tail = b""
            async for chunk in resp.content.iter_any():
                seen = tail + chunk
                if ttft is None and call.content is not None and call.content.search(seen):
                    ttft = time.perf_counter() - started
                tail = seen[-_MARKER_SPAN:]
            if resp.status != 200:
                return False, None, f"HTTP {resp.status}: {tail!r}"
            if ttft is None or call.end not in tail:
                return False, None, f"incomplete stream (content seen: {ttft is not None}), ends {tail!r}"
            return True, ttft, None
    except Exception as exc:  # any failure is the server's answer to this request, not the run's end
        return False, None, f"{type(exc).__name__}: {exc}"


async def run_count(
    base_url: str, call: Call, concurrency: int, n: int, counter: itertools.count[int]
) -> int:
    """Send ``n`` requests at ``concurrency`` as fast as they go; return how many failed."""
    left = n
    errors = 0
    url = base_url + call.path
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=120),
        auto_decompress=False,
    ) as session:

        async def worker(w: int) -> None:
            nonlocal left, errors
            while left > 0:
                left -= 1
                ok, _, _ = await _one(
                    session, url, call, call.next_body(w, next(counter)), time.perf_counter()
                )
                errors += not ok

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return errors
