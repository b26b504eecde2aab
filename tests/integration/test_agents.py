"""Real coding agents, headless, through the router to the local upstream.

Claude Code and Codex CLI come from npm, installed once into ``.agents/`` with the other npm agents
(``agentkit``; pinned versions). Without npm these tests skip and say why. opencode, Qwen Code,
aider and mini-swe-agent are run in ``test_agents_more.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.agentkit import agent_env
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration


def test_claude_code_headless(router: RunningRouter, npm_agents: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('hi')\n")
    env = agent_env(tmp_path, ANTHROPIC_BASE_URL=router.url, ANTHROPIC_API_KEY="sk-ant-router")
    proc = subprocess.run(
        [str(npm_agents / "claude"), "-p", "list the files here", "--output-format", "json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["is_error"] is False, result
    rows = router.records(wait_for=2)
    main = [r for r in rows if r["protocol"] == "anthropic" and r["status"] == 200]
    assert main, rows
    # Claude Code asks for thinking on its main loop: the policy keeps that on the Anthropic backend.
    thinking = [
        r
        for r in main
        if r["reasoning_effort"] or r["thinking_budget"] or r["chosen_model"] == "local-claude"
    ]
    assert thinking
    assert all(r["task_id"].startswith("session-") for r in main)
    assert all(r["ttft_ms"] is not None for r in main if r["stream"])


def test_codex_cli_tool_turn(router: RunningRouter, npm_agents: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("# demo\n")
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    provider = f'{{name="router",base_url="{router.url}/v1",wire_api="responses",env_key="ROUTER_KEY"}}'
    env = agent_env(tmp_path, CODEX_HOME=str(codex_home), ROUTER_KEY="router-key")
    proc = subprocess.run(
        [str(npm_agents / "codex"), "exec", "--json", "--skip-git-repo-check", "-c", "model_provider=router",
         "-c", f"model_providers.router={provider}", "-m", "auto", "list the files"],
        cwd=work, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kinds = [e["type"] for e in events]
    assert "turn.completed" in kinds, proc.stdout
    commands = [
        e["item"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"
    ]
    assert commands and commands[0]["exit_code"] == 0
    rows = router.records(wait_for=2)
    responses = [r for r in rows if r["protocol"] == "openai_responses"]
    assert len(responses) >= 2 and all(r["status"] == 200 for r in responses)
    assert all(r["input_tokens"] and r["output_tokens"] and r["cost_usd"] is not None for r in responses)
    assert responses[-1]["cache_read_tokens"], "the second turn reuses the first turn's prefix"
