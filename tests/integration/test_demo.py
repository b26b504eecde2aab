"""`router demo` as a new user runs it: a real process, the local fake provider, the log it leaves."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MASTER = "demo-master-key-0123456789abcdef"


def run_demo(
    tmp_path: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``router demo FLAGS`` on ``tmp_path/demo.db`` and any free ports; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "router.app.cli", "demo", "--port", "0", "--upstream-port", "0",
         "--store", f"sqlite:///{tmp_path / 'demo.db'}", *flags],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


def statuses(db: Path) -> list[int]:
    con = sqlite3.connect(db)
    try:
        return [s for (s,) in con.execute("SELECT status FROM requests ORDER BY ts")]
    finally:
        con.close()


def test_demo_runs_with_the_master_key_exported(tmp_path: Path) -> None:
    """README step 2 exports ROUTER_MASTER_KEY; the demo run afterwards still routes its requests
    (it sends the key it is given) instead of collecting 401s and failing on the route preview."""
    done = run_demo(tmp_path, env={"ROUTER_MASTER_KEY": MASTER})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # Six requests served, the unknown model refused as it should be: none refused for the key.
    assert sorted(statuses(tmp_path / "demo.db")) == [200] * 6 + [404], done.stdout
    assert "POST /v1/route for the 40k-token prompt: chose" in done.stdout
    assert MASTER not in done.stdout + done.stderr  # the key is used, never printed
    # "router on URL  ·  local upstream on URL  ·  policy local.yaml", wrapped before "policy".
    assert re.search(
        r"^router on http://\S+, policy local\.yaml\nlocal upstream on http://\S+$", done.stdout, re.M
    ), done.stdout
    # It ended on the log's table, with nothing said of what comes next.
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    assert done.stdout.splitlines()[-3:] == [
        "Next (README, five minutes):",
        f"  router demo --serve --store {store}        # keep it running: the dashboard, and agents pointed at it",
        f"  router demo --tasks 300 --store {store}    # 300 SWE-bench tasks through it, a log `router train` "
        "learns from",
    ], done.stdout


def test_demo_tasks_label_each_task_with_the_shipped_outcome_of_the_model_that_served_it(
    tmp_path: Path,
) -> None:
    """``--tasks N``: N multi-turn tasks on shipped SWE-bench issues, each one's verdict the one
    swe_outcomes.csv records for the real model its backend stands for; new task ids on every run."""
    import csv
    from collections import Counter

    from router.app.demotasks import STANDS_FOR

    for _ in range(2):  # a second run adds its own tasks, never merging into the first run's
        done = run_demo(tmp_path, "--tasks", "12", env={"ROUTER_MASTER_KEY": MASTER})
        assert done.returncode == 0, done.stdout + done.stderr
        assert "12 tasks (" in done.stdout and "router train --config" in done.stdout, done.stdout
    con = sqlite3.connect(tmp_path / "demo.db")
    try:
        served: dict[str, Counter[str]] = {}
        # The demo's own tasks (a port the OS hands out may still be known to some other client).
        rows = con.execute("SELECT task_id, chosen_model, status FROM requests WHERE task_id LIKE 'demo-%'")
        for task, model, status in rows:
            assert status == 200, (task, model, status)
            served.setdefault(task, Counter())[model] += 1
        verdicts = dict(con.execute("SELECT task_id, success FROM outcomes WHERE explicit = 1"))
    finally:
        con.close()
    assert len(served) == 24 and set(verdicts) == set(served)  # unique ids per run, every task labelled
    assert any(sum(c.values()) > 1 for c in served.values())  # tasks of several turns
    with (Path(__file__).resolve().parents[2] / "evals/data/swebench-verified/swe_outcomes.csv").open() as f:
        shipped = {(r["instance_id"], r["model_id"]): r["resolved"] == "1" for r in csv.DictReader(f)}
    for task, counts in served.items():
        instance = task.split("-", 3)[3]  # demo-RUN-NNNN-INSTANCE
        assert bool(verdicts[task]) == shipped[(instance, STANDS_FOR[counts.most_common(1)[0][0]])], task


def test_the_next_steps_the_demo_prints_paste_whole_at_80_columns(tmp_path: Path) -> None:
    """The commands after ``--tasks`` were wrapped at 80 columns ("--out" then the path on the next
    line), so a pasted line ran ``router train`` without its artifact path."""
    done = subprocess.run(
        [sys.executable, "-m", "router.app.cli", "demo", "--tasks", "3", "--port", "0", "--upstream-port", "0"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "ROUTER_STORE"}, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # Run from elsewhere than the checkout: the policy's path is a long absolute one.
    assert re.search(
        r"^  router train --config /\S+/local\.yaml --out policies/learned/demo\.json$", done.stdout, re.M
    ), done.stdout
    assert re.search(r"^  cp (/\S+)/local\.yaml \1/local\.candidate\.yaml$", done.stdout, re.M), done.stdout


def test_demo_serve_in_open_mode_says_to_send_a_key(tmp_path: Path) -> None:
    """Open mode lets any key in, but the OpenAI SDK will not start without one and Claude Code asks
    to log in: the lines ``demo --serve`` prints set one, each on one line at 80 columns."""
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_MASTER_KEY", "ROUTER_STORE")}
    shown = subprocess.Popen(
        [sys.executable, "-m", "router.app.cli", "demo", "--serve", "--port", "0", "--upstream-port", "0",
         "--store", f"sqlite:///{tmp_path / 'demo.db'}"],
        cwd=tmp_path, env={**env, "COLUMNS": "80"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    said: list[str] = []
    try:
        assert shown.stdout is not None
        for line in shown.stdout:
            said.append(line)
            if "OPENAI_BASE_URL=" in line:
                break
    finally:
        shown.send_signal(signal.SIGINT)
        assert shown.stdout is not None
        # Printed with the lines above, before the Ctrl-C (and already read ahead with them).
        said.append(shown.stdout.readline())
        shown.communicate(timeout=60)
    claude = next(line for line in said if "ANTHROPIC_BASE_URL=" in line)
    assert re.fullmatch(r"  ANTHROPIC_BASE_URL=http://\S+ ANTHROPIC_API_KEY=anything claude\n", claude), said
    assert re.fullmatch(r"  OPENAI_BASE_URL=http://\S+/v1 OPENAI_API_KEY=anything .*auto.*\n", said[-2]), said
    # The router's guess at an agent's task is no verdict on the fake provider's replies: a Claude
    # Code session was "success (outcome_model)" at P 0.98, and nothing said how to set it.
    assert said[-1].startswith("Their tasks are done or failed by the router's guess (inferred)"), said
    assert "router outcome TASK_ID --success|--failure" in said[-1] and "the guess means little" in said[-1]


def test_demo_tasks_interrupted_say_how_much_of_the_log_is_labelled(tmp_path: Path) -> None:
    """A Ctrl-C during `router demo --tasks 300` said nothing (exit 130) and left tasks in flight
    with no outcome, which `router tasks` showed as the router's guess: a success, inferred."""
    import signal
    import time

    db = tmp_path / "demo.db"
    shown = subprocess.Popen(
        [sys.executable, "-m", "router.app.cli", "demo", "--tasks", "300", "--concurrency", "4", "--port", "0",
         "--upstream-port", "0", "--store", f"sqlite:///{db}"],
        cwd=tmp_path, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        assert shown.stdout is not None
        for line in shown.stdout:
            if line.startswith("local upstream on"):
                break
        time.sleep(2)  # some tasks done, four in flight
    finally:
        shown.send_signal(signal.SIGINT)
        out = shown.communicate(timeout=60)[0]
    assert shown.returncode == 130, out
    said = re.search(r"router demo: interrupted after (\d+) of 300 tasks, (\d+) of them labelled, in (\S+?)[;:] "
                     r"(?:the (\d+) in flight may have no outcome)?", out)  # fmt: skip
    assert said, out
    assert said.group(3) == f"sqlite:///{db}", out
    con = sqlite3.connect(db)
    try:
        (labelled,) = con.execute("SELECT count(*) FROM outcomes WHERE explicit = 1").fetchone()
    finally:
        con.close()
    # What the log holds, as said: a task in flight may have had its outcome written as it stopped.
    assert int(said.group(2)) <= labelled <= int(said.group(2)) + int(said.group(4) or 0), out


def test_demo_tasks_without_the_data_say_where_they_looked(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--tasks", "3", "--data", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "pass --data DIR" in done.stderr, done.stderr
    assert not (tmp_path / "demo.db").exists()  # nothing started


def _sh(cwd: Path, env: dict[str, str], *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "router.app.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"router {' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_readmes_five_minute_path_on_the_demo(tmp_path: Path) -> None:
    """README steps 1-8 as a new user on the demo alone runs them, the master key exported: the demo,
    its 300 labelled tasks, a router serving the demo policy, an agent's request, the dashboard, a
    verdict, training without --force, preview, promotion (the serving router picks up the learned
    policy, whose P(success) per candidate the task's page shows) and rollback."""
    import re
    import shutil
    import signal
    import time

    import httpx
    import openai

    from tests.integration.test_serve_process import free_port, wait_ready

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "policies", tmp_path / "policies")  # the steps write into policies/
    env = {**os.environ, "COLUMNS": "200", "ROUTER_MASTER_KEY": MASTER}
    env.pop("ROUTER_STORE", None)
    demo_policy = "policies/examples/local.yaml"
    auth = {"authorization": f"Bearer {MASTER}"}

    # 1. The demo, then (the demo alone leaves too few tasks to learn from) 300 labelled tasks.
    shown = subprocess.Popen([sys.executable, "-m", "router.app.cli", "demo", "--serve", "--port", "0",
                              "--upstream-port", "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert shown.stdout is not None
        for line in shown.stdout:
            if found := re.search(r"Dashboard: (http://127\.0\.0\.1:\d+)/ui", line):
                break
        else:
            pytest.fail("no dashboard URL")
        with httpx.Client(base_url=found.group(1), timeout=10) as c:
            assert c.post("/ui/login", data={"key": MASTER, "next": "/ui"}).status_code == 303
            assert "local-demo" in c.get("/ui").text
    finally:
        shown.send_signal(signal.SIGINT)
        shown.communicate(timeout=60)
    _sh(tmp_path, env, "demo", "--tasks", "300", "--port", "0", "--upstream-port", "0")

    # 2-4. The router on the demo policy (the local provider standing in for the real ones), an agent
    # pointed at it with the master key, the dashboard.
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "router.app.cli", "upstream", "--port", str(up_port)],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    serve_env = {**env, "ROUTER_LOCAL_UPSTREAM": f"http://127.0.0.1:{up_port}"}
    serving = subprocess.Popen([sys.executable, "-m", "router.app.cli", "serve", "--config", demo_policy,
                                "--port", str(port)], cwd=tmp_path, env=serve_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, serving)
        agent = openai.OpenAI(base_url=f"{base}/v1", api_key=MASTER, max_retries=0, timeout=30)
        body = [{"role": "user", "content": "Fix the failing test in test_parser.py"}]
        reply = agent.chat.completions.with_raw_response.create(model="auto", messages=body)  # type: ignore[arg-type]
        task = reply.headers["x-router-task-id"]
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.post("/ui/login", data={"key": MASTER, "next": "/ui"}).status_code == 303
            assert "cost per completed task" in c.get("/ui").text

            # 5. How tasks ended.
            assert task in _sh(tmp_path, env, "tasks", "--recent").stdout
            _sh(tmp_path, env, "outcome", task, "--success")

            # 6. Training on the log: enough labelled attempts of every model, no --force.
            trained = _sh(
                tmp_path, env, "train", "--config", demo_policy, "--out", "policies/learned/v1.json"
            )
            assert "wrote policies/learned/v1.json" in trained.stdout
            # The demo's attempts are a few calls each: no cap learned from them (one of 4 calls,
            # promoted, would stop real agents' attempts), and the output says why.
            assert "call caps: none; no cap for " in trained.stdout, trained.stdout

            # 7. Preview on a copy of the policy.
            shutil.copy(tmp_path / demo_policy, tmp_path / "policies/candidate.yaml")
            _sh(tmp_path, env, "promote", "policies/learned/v1.json", "--config", "policies/candidate.yaml")
            assert "  artifact: learned/v1.json\n" in (tmp_path / "policies/candidate.yaml").read_text()
            previewed = _sh(tmp_path, env, "preview", "--config", "policies/candidate.yaml", "--since", "7d")
            assert "decided again" in previewed.stdout

            # 8. Promotion: the running router reloads it within a second; rollback undoes it.
            before = c.get("/v1/policy", headers=auth).json()["revision"]
            _sh(tmp_path, env, "promote", "policies/learned/v1.json", "--config", demo_policy)
            assert "  artifact: ../learned/v1.json\n" in (tmp_path / demo_policy).read_text()
            deadline = time.monotonic() + 10
            while c.get("/v1/policy", headers=auth).json()["revision"] == before:
                assert time.monotonic() < deadline, "the serving router did not pick up the promotion"
                time.sleep(0.2)
            learned = agent.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "Add a --verbose flag to the CLI"}]
            )
            deadline = time.monotonic() + 15  # the log is written in batches
            while "P(success)" not in (
                page := c.get(f"/ui/tasks/{learned.headers['x-router-task-id']}").text
            ):
                assert time.monotonic() < deadline, page
                time.sleep(0.25)
            assert "/learned" in page
            _sh(tmp_path, env, "rollback", "--config", demo_policy)
            deadline = time.monotonic() + 10
            while c.get("/v1/policy", headers=auth).json()["revision"] != before:
                assert time.monotonic() < deadline, "the serving router did not pick up the rollback"
                time.sleep(0.2)
    finally:
        serving.send_signal(signal.SIGTERM)
        upstream.send_signal(signal.SIGTERM)
        out = serving.communicate(timeout=60)[0].decode()
        upstream.communicate(timeout=60)
    assert MASTER not in out  # the key was sent on every request, and never printed


def test_router_upstream_answers_every_request_with_the_behaviour_given(tmp_path: Path) -> None:
    """An agent pointed at the demo's provider ran `ls` on every turn until killed (mini-swe-agent:
    1,131 steps in two minutes, and `router upstream` had no way to say otherwise): `--behaviour`
    makes every tool call run the command given, such as the agent's completion marker."""
    import time

    import httpx

    from tests.integration.test_serve_process import free_port

    port = free_port()
    marker = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && ls"
    upstream = subprocess.Popen([sys.executable, "-m", "router.app.cli", "upstream", "--port", str(port),
                                 "--behaviour", f"tool=always,tool_arg={marker}"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    tool = {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}  # fmt: skip
    body = {
        "model": "nano-model",
        "messages": [{"role": "user", "content": "list the files"}],
        "tools": [tool],
    }
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=10)
                break
            except httpx.TransportError:
                assert upstream.poll() is None and time.monotonic() < deadline, "the upstream did not start"
                time.sleep(0.2)
        [call] = reply.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["arguments"] == '{"command":"' + marker + '"}'
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
