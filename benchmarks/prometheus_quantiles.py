"""``python -m benchmarks.prometheus_quantiles [--requests 80] [--seed 1]``: does Prometheus read
the latency quantiles the log has?

Starts the fake upstream, the router and a real Prometheus (the ``prometheus`` binary on the PATH,
e.g. Debian's package) scraping ``/metrics`` every second. Sends streamed requests one after another,
each with a time to first token drawn from a log-normal (median 150 ms, sigma 0.6: tens of ms to
about a second, as agents see), set through the fake provider's control endpoint. Once Prometheus
has scraped every request, prints PromQL ``histogram_quantile`` of ``router_ttft_seconds`` next to
the log's own quantile (the one ``router report`` prints) and the mean from ``_sum / _count``, and
runs ``promtool check metrics`` on the exposition. Everything started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.procs import Services, free_port
from benchmarks.run import ROOT, entry, handle_interrupts
from router.telemetry.report import quantile

MODEL = "spread-model"
QUANTILES = (0.5, 0.9, 0.99)


def policy(upstream_url: str) -> str:
    model = {"id": "timed", "litellm_model": f"openai/{MODEL}@chunk_ms=2,chunks=5", "protocol": "openai",
             "api_base": upstream_url + "/v1", "prices": {"input": 0.25, "output": 2.0},
             "context_window": 128000, "max_output_tokens": 16384}  # fmt: skip
    return json.dumps({"version": 1, "name": "prometheus-quantiles", "models": [model],
                       "routes": [{"match": "timed", "passthrough": "timed"}]})  # fmt: skip


def promql(url: str, query: str) -> float | None:
    result = httpx.get(url + "/api/v1/query", params={"query": query}, timeout=10).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("needs the prometheus and promtool binaries on the PATH (Debian: apt-get install prometheus)")
        return 2
    handle_interrupts()
    workdir = Path(tempfile.mkdtemp(prefix="router-promq-"))
    try:
        with Services(workdir) as svc:
            up_port, router_port, prom_port = free_port(), free_port(), free_port()
            up = svc.launch("upstream", [sys.executable, "-m", "router.fakeupstream", "--host", "127.0.0.1",
                                         "--port", str(up_port)],
                            url=f"http://127.0.0.1:{up_port}", core=None, env={}, cwd=ROOT)  # fmt: skip
            svc.wait_ready(up, "/v1/models")
            (workdir / "policy.yaml").write_text(policy(up.url))  # JSON is YAML
            router = svc.launch("router", [sys.executable, "-m", "router.app.cli", "serve", "--config",
                                           str(workdir / "policy.yaml"), "--host", "127.0.0.1", "--port",
                                           str(router_port), "--store", f"sqlite:///{workdir / 'log.db'}",
                                           "--log-level", "warning"],
                                url=f"http://127.0.0.1:{router_port}", core=None, env={}, cwd=ROOT)  # fmt: skip
            svc.wait_ready(router, "/healthz")
            (workdir / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: router\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{router_port}']}}]\n"
            )
            prom = svc.launch("prometheus", ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                                             f"--storage.tsdb.path={workdir / 'tsdb'}",
                                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                              url=f"http://127.0.0.1:{prom_port}", core=None, env={}, cwd=workdir)  # fmt: skip
            svc.wait_ready(prom, "/-/ready")
            drive(up.url, router.url, args.requests, random.Random(args.seed))
            ttft_ms = logged_ttft_ms(workdir / "log.db", args.requests)
            until_scraped(prom.url, args.requests)
            lint = subprocess.run(["promtool", "check", "metrics"], capture_output=True, check=False,
                                  input=httpx.get(router.url + "/metrics", timeout=10).content)  # fmt: skip
            print_table(prom.url, ttft_ms)
            problems = (lint.stdout + lint.stderr).decode().strip()
            print(
                f"promtool check metrics: exit {lint.returncode}{': ' + problems if problems else ', no findings'}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def drive(upstream: str, router: str, n: int, rng: random.Random) -> None:
    body = {"model": "timed", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            ttft_ms = round(min(3000.0, rng.lognormvariate(math.log(150), 0.6)), 1)
            client.post(upstream + "/_control/behaviour", json={"model": MODEL, "ttft_ms": ttft_ms})
            with client.stream("POST", router + "/v1/chat/completions", json=body) as reply:
                reply.raise_for_status()
                for _line in reply.iter_lines():
                    pass


def logged_ttft_ms(db: Path, n: int, timeout_s: float = 30) -> list[float]:
    """The log's TTFTs once the writer has flushed all ``n`` rows (it batches in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        con = sqlite3.connect(db)
        try:
            values = [r[0] for r in con.execute("SELECT ttft_ms FROM requests WHERE ttft_ms IS NOT NULL")]
        except sqlite3.OperationalError:
            values = []
        finally:
            con.close()
        if len(values) >= n:
            return values
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(values)} of {n} requests were logged in {timeout_s:.0f} s")
        time.sleep(0.2)


def until_scraped(prom: str, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while promql(prom, 'router_ttft_seconds_count{backend="timed"}') != n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Prometheus did not scrape all {n} requests in {timeout_s:.0f} s")
        time.sleep(0.5)


def print_table(prom: str, ttft_ms: list[float]) -> None:
    values = sorted(ttft_ms)
    print(f"TTFT of {len(values)} streamed requests, Prometheus (PromQL) vs the log:")
    print(f"{'':>6} {'prometheus ms':>14} {'log ms':>10} {'off':>8}")
    for q in QUANTILES:
        read = promql(prom, f'histogram_quantile({q}, router_ttft_seconds_bucket{{backend="timed"}})')
        exact = quantile(values, q)
        assert read is not None and exact is not None
        print(
            f"{'p' + str(round(q * 100)):>6} {read * 1000:>14.1f} {exact:>10.1f} {100 * (read * 1000 / exact - 1):>+7.1f}%"
        )
    mean = promql(
        prom, 'router_ttft_seconds_sum{backend="timed"} / router_ttft_seconds_count{backend="timed"}'
    )
    assert mean is not None
    print(f"{'mean':>6} {mean * 1000:>14.3f} {sum(values) / len(values):>10.3f}")


if __name__ == "__main__":
    entry(main)
