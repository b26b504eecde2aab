"""``python -m benchmarks.startup``: how long a (re)start keeps the router from serving.

Starts ``router serve`` on the demo policy against the fake upstream, ``--runs`` times, and
measures from the process's launch to: ``/readyz`` answering 200 (the load balancer sends
traffic), the first relayed reply, and the first translated reply (an Anthropic client served
by an OpenAI backend, which needs litellm, loaded in the background once serving), and the
median latency of 20 sequential relayed requests after that; then from SIGTERM to the process's
exit, once litellm is loaded (``stop``) and, in a start of its own, as soon as ``/readyz`` says
200 (``stop early``: litellm still loading, which the exit must not wait for). Both with
``ROUTER_DRAIN_DELAY=0``. Modes, interleaved run by run so each sees the same machine, printed
side by side as medians:

* ``default``  litellm and the tokenizer load in the background once serving;
* ``preload``  ``ROUTER_PRELOAD=1``: litellm and the tokenizer load before serving (the old start);
* ``durable``  ``ROUTER_DURABLE_LOG=1``: each reply waits for its record to be stored.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from benchmarks.procs import Service, Services, free_port
from benchmarks.run import ROOT, entry

CHAT = {"model": "local-large", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "local-large", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}


def _post(url: str, body: dict[str, object]) -> int:
    request = urllib.request.Request(
        url, data=orjson.dumps(body), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return int(reply.status)


def _until(check: object, timeout: float = 120.0) -> float:
    """Poll ``check`` every 10 ms until it returns True; the monotonic time it first did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return time.monotonic()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.01)
    raise TimeoutError("the router did not get there in time")


def _ready(url: str) -> bool:
    with urllib.request.urlopen(url + "/readyz", timeout=2) as reply:
        return bool(reply.status == 200)


MODES = {
    "default": {},
    "preload": {"ROUTER_PRELOAD": "1"},
    "durable": {"ROUTER_DURABLE_LOG": "1"},
}


def one_start(svc: Services, upstream: str, workdir: Path, run: str, mode: str) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUTER_")}
    env.update(ROUTER_LOCAL_UPSTREAM=upstream, ROUTER_DRAIN_DELAY="0", ROUTER_DRAIN_TIMEOUT="2")
    env.update(MODES[mode])
    argv = [sys.executable, "-m", "router.app.cli", "serve", "--config", str(ROOT / "policies/examples/local.yaml"),
            "--port", str(port), "--store", f"sqlite:///{workdir / f'r{run}.db'}", "--log-level", "warning"]  # fmt: skip
    started = time.monotonic()
    router = svc.launch(f"router-{run}", argv, url=url, core=None, env=env, cwd=ROOT)
    try:
        ready = _until(lambda: _ready(url))
        relayed = _until(lambda: _post(url + "/v1/chat/completions", CHAT) == 200)
        translated = _until(lambda: _post(url + "/v1/messages", MESSAGES) == 200)
        latency = []
        for _ in range(20):
            t0 = time.perf_counter()
            _post(url + "/v1/chat/completions", CHAT)
            latency.append((time.perf_counter() - t0) * 1000)
        stop = _stop(svc, router)
    finally:
        svc.stop(router)
    early = svc.launch(f"router-{run}-early", argv, url=url, core=None, env=env, cwd=ROOT)
    try:
        _until(lambda: _ready(url))
        stop_early = _stop(svc, early)
    finally:
        svc.stop(early)
    return {
        "ready_s": ready - started,
        "first_relayed_s": relayed - started,
        "first_translated_s": translated - started,
        "request_ms": statistics.median(latency),
        "stop_s": stop,
        "stop_early_s": stop_early,
    }


def _stop(svc: Services, router: Service) -> float:
    """Seconds from SIGTERM to the process's exit."""
    t0 = time.monotonic()
    svc.stop(router)
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp, Services(Path(tmp)) as svc:
        up_port = free_port()
        upstream = svc.launch(
            "upstream", [sys.executable, "-m", "router.fakeupstream", "--host", "127.0.0.1", "--port", str(up_port)],
            url=f"http://127.0.0.1:{up_port}", core=None, env=os.environ, cwd=ROOT,
        )  # fmt: skip
        svc.wait_ready(upstream, "/v1/models")
        modes = [m for m in args.modes.split(",") if m]
        unknown = set(modes) - set(MODES)
        if unknown:
            parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for run in range(args.runs):
            for mode in modes:  # interleaved, so every mode sees the same machine
                results[mode].append(one_start(svc, upstream.url, Path(tmp), f"{mode}-{run}", mode))
    print(f"router start-up, median of {args.runs} runs (seconds from launch; request ms: 20 sequential;"
          " stop: seconds from SIGTERM to exit)")  # fmt: skip
    print(
        f"{'mode':<10}{'ready':>8}{'relayed':>10}{'translated':>12}{'request ms':>12}{'stop':>7}{'stop early':>12}"
    )
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{mode:<10}{med['ready_s']:>8.2f}{med['first_relayed_s']:>10.2f}"
              f"{med['first_translated_s']:>12.2f}{med['request_ms']:>12.2f}"
              f"{med['stop_s']:>7.2f}{med['stop_early_s']:>12.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    entry(main)
