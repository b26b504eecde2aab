"""The README's recipes for opencode, Qwen Code, aider and mini-swe-agent, run headless against a router.

Each test reads its recipe out of the README (the table row's environment and command) or
docs/agents.md (opencode's ``opencode.json`` block), points it at the test's router and adds only
what makes the run headless (a one-shot prompt, no confirmations). The agents are real, installed
by ``agentkit``: opencode and Qwen Code from npm with the other npm agents, aider and mini-swe-agent
from PyPI, each in its own virtualenv. Every agent's HOME is a fresh directory, so no earlier run's
state counts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from router.fakeupstream import Behaviour, FakeUpstream
from tests.integration.agentkit import (
    README_URL,
    agent_env,
    command_recipe,
    fenced_block,
    install_pypi_agent,
)
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

AIDER = ("aider-chat", "0.86.2")
MINI_SWE_AGENT = ("mini-swe-agent", "2.4.6")
KEY = "router-key"
TIMEOUT = 240


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('hi')\n")
    return work


def run(argv: list[str], work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A shell sets PWD to where it runs a command and subprocess does not; opencode takes its
    # project directory (and so its opencode.json) from PWD, not from the working directory.
    env = {**env, "PWD": str(work)}
    proc = subprocess.run(
        argv, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def chat_rows(router: RunningRouter, wait_for: int) -> list[dict[str, Any]]:
    """The router's log rows, each checked to be a served Chat Completions call for model ``auto``."""
    rows = router.records(wait_for=wait_for)
    assert len(rows) >= wait_for, rows
    for row in rows:
        assert (row["protocol"], row["requested_model"], row["status"]) == ("openai_chat", "auto", 200), row
        assert row["input_tokens"] and row["cost_usd"] is not None, row
    return rows


def one_task_has_turns(rows: list[dict[str, Any]], turns: int) -> bool:
    """True if some task holds ``turns`` calls: the router saw the tool turn and its follow-up as one."""
    ids = [r["task_id"] for r in rows]
    return any(ids.count(i) >= turns for i in ids)


def test_opencode_recipe(router: RunningRouter, npm_agents: Path, tmp_path: Path) -> None:
    work = workdir(tmp_path)
    config = fenced_block("opencode, in `opencode.json`", "json")
    (work / "opencode.json").write_text(config.replace(README_URL, router.url))
    # This machine has no internet: the two documented switches stop opencode's model-list
    # download and update check, which would only fail (and print errors) here.
    env = agent_env(
        tmp_path, ROUTER_KEY=KEY, OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1"
    )
    proc = run([str(npm_agents / "opencode"), "run", "--format", "json", "list the files"], work, env)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    tools = [e["part"] for e in events if e["type"] == "tool_use"]
    assert tools and tools[0]["state"]["status"] == "completed", proc.stdout
    assert "hello.py" in tools[0]["state"]["output"]  # the fake provider's command ran here
    texts = [e["part"]["text"] for e in events if e["type"] == "text"]
    assert texts and texts[-1].startswith("Tool result received: hello.py"), proc.stdout
    # opencode titles the session with a call of its own, then runs the tool turn and its answer.
    rows = chat_rows(router, wait_for=3)
    assert one_task_has_turns(rows, 2), rows


def test_qwen_code_recipe(router: RunningRouter, npm_agents: Path, tmp_path: Path) -> None:
    work = workdir(tmp_path)
    env, argv = command_recipe("Qwen Code", router.url, KEY)
    assert argv == ["qwen"]
    settings = tmp_path / ".qwen" / "settings.json"
    settings.parent.mkdir()
    # docs/agents.md's switch for Qwen Code's usage statistics, which it would send to its vendor.
    settings.write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False}}))
    proc = run(
        [str(npm_agents / "qwen"), "list the files", "--output-format", "json"],
        work,
        agent_env(tmp_path, **env),
    )
    messages = json.loads(proc.stdout)
    result = messages[-1]
    assert result["type"] == "result" and result["is_error"] is False, result
    blocks = [b for m in messages if m["type"] in ("assistant", "user") for b in m["message"]["content"]]
    kinds = [b["type"] for b in blocks]
    assert kinds[:3] == ["tool_use", "tool_result", "text"], blocks
    assert blocks[1]["is_error"] is False
    rows = chat_rows(router, wait_for=2)
    assert one_task_has_turns(rows, 2), rows
    # Qwen Code opens each session with the same context turn (the date, the OS, the folder's
    # listing, a canned "Got it.") before the task: two sessions in one folder on one day were one
    # task, and one attempt, whatever each was asked, until the task's own message counted.
    run(
        [str(npm_agents / "qwen"), "show me hello.py", "--output-format", "json"],
        work,
        agent_env(tmp_path, **env),
    )
    rows = chat_rows(router, wait_for=4)
    tasks = {r["task_id"] for r in rows}
    assert len(tasks) == 2 and all(sum(r["task_id"] == t for r in rows) == 2 for t in tasks), rows


def test_aider_recipe(router: RunningRouter, upstream: FakeUpstream, tmp_path: Path) -> None:
    bin_dir = install_pypi_agent(*AIDER)
    work = workdir(tmp_path)
    env, argv = command_recipe("aider", router.url, KEY)
    assert argv[0] == "aider"
    # --yes-always would also say yes to aider's analytics prompt: docs/agents.md says to turn them off.
    headless = ["--yes-always", "--analytics-disable", "--no-git", "--message", "add a docstring to hello.py",
                "hello.py"]  # fmt: skip
    proc = run([str(bin_dir / "aider"), *argv[1:], *headless], work, agent_env(tmp_path, **env))
    assert "This is a fake reply." in proc.stdout, proc.stdout  # the provider's answer, via the router
    rows = chat_rows(router, wait_for=1)
    assert all(r["stream"] for r in rows)  # aider streams
    sent = [json.dumps(r["body"]) for r in upstream.requests() if r["path"] == "/v1/chat/completions"]
    assert any("print('hi')" in body for body in sent), "aider sent the file it was given"


def test_mini_swe_agent_recipe(router_factory: Callable[..., RunningRouter], tmp_path: Path) -> None:
    bin_dir = install_pypi_agent(*MINI_SWE_AGENT)
    work = workdir(tmp_path)
    # mini-swe-agent stops when a command's output starts with its completion marker: this
    # provider's tool calls run that command, then list the files as the "submission".
    finish = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && ls"
    with FakeUpstream(Behaviour(tool_arg=finish)) as upstream:
        router = router_factory(local_policy(upstream.url))
        env, argv = command_recipe("mini-swe-agent", router.url, KEY)
        assert argv[0] == "mini"
        trajectory = tmp_path / "run.traj.json"
        headless = ["-t", "list the files", "--yolo", "--exit-immediately", "-o", str(trajectory)]
        # litellm (inside mini-swe-agent) would fetch its price list first; offline, its
        # documented switch keeps it to the copy it ships instead of three failing retries.
        env = agent_env(tmp_path, LITELLM_LOCAL_MODEL_COST_MAP="True", **env)
        run([str(bin_dir / "mini"), *argv[1:], *headless], work, env)
        info = json.loads(trajectory.read_text())["info"]
        assert info["exit_status"] == "Submitted", info
        assert info["submission"].split() == ["hello.py"]  # the command ran in the work directory
        chat_rows(router, wait_for=1)
