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
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass
class Live:
    """The demo's router and fake provider, serving in this process."""

    base: str
    upstream: str
    #: What a client sends to be let in: the master key when one is exported (README step 2).
    auth: dict[str, str]
    server: uvicorn.Server
    thread: threading.Thread


@contextlib.contextmanager
def serving(store: str, port: int | None, upstream_port: int | None) -> Iterator[Live]:
    """The local fake provider and the router on the demo policy, stopped (log flushed) on exit."""
    from router.app.factory import create_app
    from router.app.serve import uvicorn_config
    from router.app.settings import load
    from router.fakeupstream import FakeUpstream

    up_sock = _free_port(9100 if upstream_port is None else upstream_port, required=upstream_port is not None)
    up_port = up_sock.getsockname()[1]
    up_sock.close()
    with FakeUpstream(port=up_port) as upstream:
        os.environ["ROUTER_LOCAL_UPSTREAM"] = upstream.url
        # Preloaded: the table's milliseconds are routing and the fake provider, not litellm's first
        # import (5-10 s on the first request otherwise, which reads as a slow router).
        settings = load(config=POLICY, store=store, preload=True)
        app = create_app(settings)
        sock = _free_port(8080 if port is None else port, required=port is not None)
        server = uvicorn.Server(
            uvicorn_config(app, settings, log_level="warning")
        )  # as `router serve` serves
        thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        key = settings.master_key.get_secret_value() if settings.master_key else None
        auth = {"authorization": f"Bearer {key}"} if key else {}
        try:
            yield Live(f"http://127.0.0.1:{sock.getsockname()[1]}", upstream.url, auth, server, thread)
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def _refused_by_keys(store: str) -> None:
    """A log that holds virtual keys closes open mode, and without the master key to send the demo
    had every request refused: seven 401s in its table and no word of why (after `router keys
    create` in the checkout, whose router.db the demo logs to)."""
    from router.app.settings import load
    from router.errors import ConfigError
    from router.store.window import opened

    master = load(config=POLICY, store=store).master_key
    if master is not None and master.get_secret_value():
        return

    async def keys() -> int:
        async with opened(store) as log:
            return len(await log.list_keys())

    try:
        held = asyncio.run(keys())
    except ConfigError:  # a log not made yet holds no key (and is not made here)
        return
    if held:
        raise ConfigError(
            f"{store} holds virtual keys (`router keys list`), so the router it logs for refuses a request "
            "without a key and the demo's would all be 401: export ROUTER_MASTER_KEY (the demo sends it), "
            "or give the demo a log of its own: router demo --store sqlite:///demo.db"
        )


def run_demo(
    store: str = "sqlite:///router.db", keep_serving: bool = False, port: int | None = None,
    upstream_port: int | None = None, tasks: int | None = None, data: Path | None = None,
    concurrency: int = 16,
) -> int:  # fmt: skip
    """``port``: where the router listens (0: any free port); None: 8080, or any free port if taken;
    ``upstream_port``: the same for the local fake provider (default 9100); ``tasks``: work that
    many SWE-bench tasks through it (``router.app.demotasks``) instead of the example requests."""
    console = Console()
    _refused_by_keys(store)
    source = None
    if tasks:
        from router.app.demotasks import load_source

        source = load_source(data)  # before anything starts: missing data is said at once
    # The demo's tables say what its own requests did; the per-request log lines start with --serve.
    request_log = logging.getLogger("router.requests")
    request_log.setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its own client's "HTTP Request:" lines
    with serving(store, port, upstream_port) as live:
        # Two lines: one, wrapped at 80 columns, ended in a dangling "·" before "policy local.yaml".
        console.print(
            f"[bold]router[/] on {live.base}, policy {POLICY.name}\nlocal upstream on {live.upstream}"
        )
        if source is not None and tasks:
            from router.app.demotasks import Progress, report, run_tasks

            t0 = time.perf_counter()
            progress = Progress()
            try:
                runs = asyncio.run(
                    run_tasks(live.base, live.auth, source, tasks, concurrency=concurrency, progress=progress)
                )
            except KeyboardInterrupt:
                # It said nothing (exit 130): how much of the log the run had labelled was a guess.
                console.print(progress.interrupted(tasks, store), highlight=False, soft_wrap=True)
                raise
            report(console, runs, time.perf_counter() - t0, source, store, POLICY)
        else:
            _examples(console, live, store)
        if keep_serving:
            _serve_on(console, live, request_log, "the tasks above" if tasks else "the requests above")
    if not tasks:
        _print_log(console, store)
        if not keep_serving:
            _print_next(console, store)
    return 0


def _print_next(console: Console, store: str) -> None:
    """What a first run leads to: it ended on the log's table, and `make demo` leaves no shell
    with the virtualenv active to guess the next command in."""
    where = "" if store == "sqlite:///router.db" else f" --store {store}"
    console.print(
        "Next (README, five minutes):\n"
        f"  router demo --serve{where}        # keep it running: the dashboard, and agents pointed at it\n"
        f"  router demo --tasks 300{where}    # 300 SWE-bench tasks through it, a log `router train` learns from",
        highlight=False, soft_wrap=True,  # a command broken at 80 columns no longer pastes as one
    )  # fmt: skip


def routed_table() -> Table:
    """The table of the example requests. The words may wrap but numbers may not: at 80 columns
    rich cut unwrappable cells, and "local-claude (explored)" read "local-claude (expl…"."""
    table = Table(title="Routed requests")
    for col in ("request", "status", "routed to", "in/out tokens", "ms"):
        table.add_column(col, no_wrap=col in ("status", "ms"))
    return table


def _examples(console: Console, live: Live, store: str) -> None:
    table = routed_table()
    # ~4.3 characters a token, as code usually has: the local provider counts characters / 4, and
    # the router tiktoken tokens, so the two counts the demo prints agree within a tenth.
    big = "    total = sum(item.price for item in order.items)\n" * 3300
    with httpx.Client(base_url=live.base, timeout=30, headers=live.auth) as client:
        sent = []
        for label, path, body, headers in _requests(big):
            t0 = time.perf_counter()
            r = client.post(
                path, content=orjson.dumps(body), headers={"content-type": "application/json", **headers}
            )
            sent.append((label, r, (time.perf_counter() - t0) * 1000))
        # A task of its own: the same prompt again would be the task above, pinned where it went.
        preview = client.post(
            "/v1/route", json={"model": "auto", "messages": [{"role": "user", "content": big}]},
            headers={"x-router-task-id": f"demo-route-{time.time_ns():x}"},
        )  # fmt: skip
    # The demo policy explores (one attempt in five): such a pick is no decision of the policy's.
    explored = _explored(
        store, [r.headers["x-request-id"] for _, r, _ in sent if "x-request-id" in r.headers]
    )
    for label, r, ms in sent:
        model = r.headers.get("x-router-model", "-")
        model += " (explored)" if r.headers.get("x-request-id") in explored else ""
        table.add_row(label, str(r.status_code), model, _usage(r), f"{ms:.0f}")
    tables.show(console, table)
    if explored:
        console.print("(explored): a random pick, as the demo policy makes one attempt in five so that its "
                      "log can train; the policy's own choice is in the log's reason", highlight=False)  # fmt: skip
    _print_route(console, preview)


def _serve_on(console: Console, live: Live, request_log: logging.Logger, what: str) -> None:
    """Keep serving until Ctrl-C, saying where the dashboard is and how to point agents at it."""
    key = bool(live.auth)
    login = " — log in with $ROUTER_MASTER_KEY" if key else ""
    # Open mode lets any key in, but clients refuse to start without one (the OpenAI SDK raises,
    # Claude Code asks to log in), so the lines say to send one.
    k = "$ROUTER_MASTER_KEY" if key else "anything"
    # soft_wrap: a command broken at 80 columns no longer pastes as one.
    console.print(f"\nDashboard: [bold]{live.base}/ui[/] ({what} are on it){login}\n"
                  f"Serving until Ctrl-C. Point agents at it (the README has a recipe per agent):\n"
                  f"  ANTHROPIC_BASE_URL={live.base} ANTHROPIC_API_KEY={k} claude\n"
                  f"  OPENAI_BASE_URL={live.base}/v1 OPENAI_API_KEY={k}   # and model \"auto\"\n"
                  # A Claude Code session here was "success (outcome_model)" on the dashboard, at
                  # P 0.98, for fake replies that did nothing: nothing said it was a guess.
                  "Their tasks are done or failed by the router's guess (inferred) until you say how one "
                  "ended: router outcome TASK_ID --success|--failure (ids: router tasks --recent). On this "
                  "fake provider, whose replies do nothing, the guess means little.",
                  highlight=False, soft_wrap=True)  # fmt: skip
    request_log.setLevel(logging.NOTSET)
    with contextlib.suppress(KeyboardInterrupt):
        live.thread.join()


def _print_route(console: Console, r: httpx.Response) -> None:
    if r.status_code != 200:  # say what the router said, as any client would see it
        console.print(f"POST /v1/route for the 40k-token prompt: {r.status_code} {r.text}", highlight=False)
        return
    p = r.json()
    excluded = ", ".join(f"{c['model']} ({c['excluded']})" for c in p["candidates"] if c.get("excluded"))
    console.print(f"POST /v1/route for the 40k-token prompt: chose [bold]{p['chosen']}[/] ({p['reason']}); "
                  f"excluded: {excluded or 'none'}")  # fmt: skip


def _explored(store: str, request_ids: list[str], wait_s: float = 3.0) -> set[str]:
    """Which of these requests were explored, from their log records (written in batches, so
    waited for; a store other than SQLite's is not read)."""
    if not store.startswith("sqlite:///"):
        return set()
    import sqlite3

    from router.policy.decide import was_explored

    marks = ",".join("?" * len(request_ids))
    deadline = time.monotonic() + wait_s
    while True:
        con = sqlite3.connect(store.removeprefix("sqlite:///"))
        try:
            rows = con.execute(
                f"SELECT request_id, decision_reason FROM requests WHERE request_id IN ({marks})", request_ids
            ).fetchall()
        except sqlite3.OperationalError:  # the table is not there yet
            rows = []
        finally:
            con.close()
        if len(rows) >= len(request_ids) or time.monotonic() > deadline:
            return {rid for rid, reason in rows if was_explored(reason)}
        time.sleep(0.05)


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
