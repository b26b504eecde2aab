"""`router demo`: the local fake provider, the router on the demo policy, and requests through it.

Everything runs in this process on 127.0.0.1: the demo shows what the router decides for a few
typical agent requests, in both protocols, and prints the log records they left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn
from rich.console import Console
from rich.table import Table

from router.telemetry import tables

POLICY = Path(__file__).resolve().parents[2] / "policies" / "examples" / "local.yaml"

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def _free_port(preferred: int, *, required: bool = False) -> socket.socket:
    """A socket bound to ``preferred``, else (unless ``required``) to any free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", preferred))
    except OSError as exc:
        if required:
            sock.close()
            raise SystemExit(f"router demo: cannot listen on 127.0.0.1:{preferred}: {exc.strerror}") from None
        sock.bind(("127.0.0.1", 0))
    return sock


def _requests(big_prompt: str) -> list[tuple[str, str, dict[str, Any], dict[str, str]]]:
    anth = {"anthropic-version": "2023-06-01"}
    return [
        ("OpenAI, short question", "/v1/chat/completions",
         {"model": "auto", "messages": [{"role": "user", "content": "Say hello."}]}, {}),
        ("OpenAI, streamed, tool", "/v1/chat/completions",
         {"model": "auto", "stream": True, "tools": [BASH_TOOL],
          "messages": [{"role": "user", "content": "List the files."}]}, {}),
        ("OpenAI, 40k-token prompt", "/v1/chat/completions",
         {"model": "auto", "messages": [{"role": "user", "content": big_prompt}]}, {}),
        ("OpenAI, premium header", "/v1/chat/completions",
         {"model": "auto", "messages": [{"role": "user", "content": "Hard question."}]},
         {"x-router-tier": "premium"}),
        ("Anthropic, streamed, thinking", "/v1/messages",
         {"model": "claude-sonnet-4-6", "max_tokens": 2048, "stream": True,
          "thinking": {"type": "enabled", "budget_tokens": 1024},
          "messages": [{"role": "user", "content": "Plan the fix."}]}, anth),
        ("Anthropic, tools, no thinking", "/v1/messages",
         {"model": "claude-haiku-4-5", "max_tokens": 1024,
          "tools": [{"name": "bash", "input_schema": BASH_TOOL["function"]["parameters"]}],  # type: ignore[index]
          "messages": [{"role": "user", "content": "Run the tests."}]}, anth),
        ("Unknown model (error)", "/v1/chat/completions",
         {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, {}),
    ]  # fmt: skip


def run_demo(
    store: str = "sqlite:///router.db", keep_serving: bool = False, port: int | None = None,
    upstream_port: int | None = None,
) -> int:  # fmt: skip
    """``port``: where the router listens (0: any free port); None: 8080, or any free port if taken;
    ``upstream_port``: the same for the local fake provider (default 9100)."""
    from router.app.factory import create_app
    from router.app.serve import uvicorn_config
    from router.app.settings import Settings
    from router.fakeupstream import FakeUpstream

    console = Console()
    up_sock = _free_port(9100 if upstream_port is None else upstream_port, required=upstream_port is not None)
    up_port = up_sock.getsockname()[1]
    up_sock.close()
    with FakeUpstream(port=up_port) as upstream:
        os.environ["ROUTER_LOCAL_UPSTREAM"] = upstream.url
        # Preloaded: the table's milliseconds are routing and the fake provider, not litellm's first
        # import (5-10 s on the first request otherwise, which reads as a slow router).
        settings = Settings(config=POLICY, store=store, preload=True)
        app = create_app(settings)
        # The demo's table says what its own requests did; the per-request log lines start with --serve.
        request_log = logging.getLogger("router.requests")
        request_log.setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # its own client's "HTTP Request:" lines
        sock = _free_port(8080 if port is None else port, required=port is not None)
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn_config(app, settings, log_level="warning")
        )  # as `router serve` serves
        thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        console.print(
            f"[bold]router[/] on {base}  ·  local upstream on {upstream.url}  ·  policy {POLICY.name}"
        )
        table = Table(title="Routed requests")
        for col in ("request", "status", "routed to", "in/out tokens", "ms"):
            table.add_column(col, no_wrap=col != "request")
        # ~4.3 characters a token, as code usually has: the local provider counts characters / 4, and
        # the router tiktoken tokens, so the two counts the demo prints agree within a tenth.
        big = "    total = sum(item.price for item in order.items)\n" * 3300
        # The demo is a client like any other: with a master key exported (README step 2) it
        # sends that key, as an agent pointed at this router would.
        key = settings.master_key.get_secret_value() if settings.master_key else None
        auth = {"authorization": f"Bearer {key}"} if key else {}
        with httpx.Client(base_url=base, timeout=30, headers=auth) as client:
            for label, path, body, headers in _requests(big):
                t0 = time.perf_counter()
                r = client.post(
                    path, content=orjson.dumps(body), headers={"content-type": "application/json", **headers}
                )
                ms = (time.perf_counter() - t0) * 1000
                usage = _usage(r)
                table.add_row(
                    label, str(r.status_code), r.headers.get("x-router-model", "-"), usage, f"{ms:.0f}"
                )
            preview = client.post(
                "/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": big}]}
            )
        tables.show(console, table)
        _print_route(console, preview)
        if keep_serving:
            login = " — log in with $ROUTER_MASTER_KEY" if key else ""
            a_key, o_key = (
                (" ANTHROPIC_API_KEY=$ROUTER_MASTER_KEY", " OPENAI_API_KEY=$ROUTER_MASTER_KEY")
                if key
                else ("", "")
            )
            console.print(f"\nDashboard: [bold]{base}/ui[/] (the requests above are on it){login}\n"
                          f"Serving until Ctrl-C. Point agents at it:\n"
                          f"  ANTHROPIC_BASE_URL={base}{a_key} claude ...\n"
                          f"  OPENAI_BASE_URL={base}/v1{o_key} ...", highlight=False)  # fmt: skip
            request_log.setLevel(logging.NOTSET)
            with contextlib.suppress(KeyboardInterrupt):
                thread.join()
        server.should_exit = True
        thread.join(timeout=30)
        _print_log(console, store)
    return 0


def _print_route(console: Console, r: httpx.Response) -> None:
    if r.status_code != 200:  # say what the router said, as any client would see it
        console.print(f"POST /v1/route for the 40k-token prompt: {r.status_code} {r.text}", highlight=False)
        return
    p = r.json()
    excluded = ", ".join(f"{c['model']} ({c['excluded']})" for c in p["candidates"] if c.get("excluded"))
    console.print(f"POST /v1/route for the 40k-token prompt: chose [bold]{p['chosen']}[/] ({p['reason']}); "
                  f"excluded: {excluded or 'none'}")  # fmt: skip


def _usage(r: httpx.Response) -> str:
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return "(streamed)"
    try:
        u = r.json().get("usage") or {}
    except ValueError:
        return "-"
    i = u.get("prompt_tokens", u.get("input_tokens"))
    o = u.get("completion_tokens", u.get("output_tokens"))
    return f"{i}/{o}" if i is not None else "-"


def _print_log(console: Console, store: str) -> None:
    if not store.startswith("sqlite:///"):
        return
    import sqlite3

    path = store.removeprefix("sqlite:///")
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT requested_model, chosen_model, status, input_tokens, output_tokens, cache_read_tokens, "
        "cost_usd, ttft_ms, total_ms FROM requests ORDER BY ts DESC LIMIT 7"
    ).fetchall()
    con.close()
    table = Table(title=f"Last log records ({path})")
    for col in ("asked", "chosen", "status", "in", "out", "cached", "cost $", "ttft ms", "total ms"):
        table.add_column(col, no_wrap=True)
    for row in reversed(rows):
        *head, cost, ttft, total = ["-" if v is None else v for v in row]
        table.add_row(*map(str, head), _num(cost, "{:.6f}"), _num(ttft, "{:.1f}"), _num(total, "{:.1f}"))
    tables.show(console, table)


def _num(v: object, fmt: str) -> str:
    return fmt.format(v) if isinstance(v, int | float) else str(v)
