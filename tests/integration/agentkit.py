"""Installing real coding agents for the tests, and reading their recipes out of the README
(the one-line recipes) and docs/agents.md (the configuration files).

npm agents are installed together, once, into ``.agents/`` (gitignored); each PyPI agent gets its
own virtualenv there (``.agents/NAME-VERSION``), made with the Python running the tests, because
their pinned dependencies would clash with ours. Versions are pinned: a new release must not turn
CI red overnight. Where an install is impossible the tests skip and say why.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / ".agents"
#: npm package (pinned) -> the command it installs. Qwen Code 0.15 is its last release that runs
#: on Node 20 (Debian's); later ones need Node 22.
NPM_AGENTS = {
    "@openai/codex@0.171.0": "codex",
    "@anthropic-ai/claude-code@2.1.197": "claude",
    "opencode-ai@1.18.33": "opencode",
    "@qwen-code/qwen-code@0.15.10": "qwen",
}
#: Where the README's recipes point; the tests put their router's address in its place.
README_URL = "http://127.0.0.1:8080"
_DONE = ".installed"


def install_npm_agents() -> Path:
    """The ``node_modules/.bin`` holding every npm agent, installing them in one npm run if needed."""
    bin_dir = AGENTS / "node_modules" / ".bin"
    if all((bin_dir / name).exists() for name in NPM_AGENTS.values()):
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: cannot install {', '.join(NPM_AGENTS.values())}")
    AGENTS.mkdir(exist_ok=True)
    proc = subprocess.run(
        [npm, "install", "--prefix", str(AGENTS), "--no-audit", "--no-fund", *NPM_AGENTS],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"npm install of the agents failed: {proc.stderr[-800:]}")
    return bin_dir


def install_pypi_agent(package: str, version: str) -> Path:
    """The ``bin`` directory of a virtualenv holding ``package==version``, made on first use."""
    venv = AGENTS / f"{package}-{version}"
    if (venv / _DONE).exists():
        return venv / "bin"
    shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
    AGENTS.mkdir(exist_ok=True)
    for command in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", f"{package}=={version}"],
    ):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"cannot install {package}=={version} ({command[0]}): {proc.stderr[-800:]}")
    (venv / _DONE).write_text(f"{package}=={version}\n")
    return venv / "bin"


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without provider settings, with a fresh HOME, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE"))}
    env.update(HOME=str(home), DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", **extra)
    return env


def readme() -> str:
    return (ROOT / "README.md").read_text()


def agents_page() -> str:
    return (ROOT / "docs" / "agents.md").read_text()


def table_recipe(client: str) -> str:
    """The recipe cell of ``client``'s row in the README's table of agents (without backticks)."""
    for line in readme().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] == client:
            return cells[1].strip("`")
    raise AssertionError(f"the README has no table row for {client}")


def command_recipe(client: str, router_url: str, key: str) -> tuple[dict[str, str], list[str]]:
    """A one-line recipe ``VAR=value ... command args`` as (environment, argv), for this router."""
    text = table_recipe(client).replace(README_URL, router_url).replace("$KEY", key)
    words = shlex.split(text)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words, f"the README's {client} recipe names no command"
    return env, words


def fenced_block(after: str, language: str) -> str:
    """The first ```language block in docs/agents.md after the line containing ``after``."""
    text = agents_page()
    start = text.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert match, f"no {language} block after {after!r} in docs/agents.md"
    return match.group(1)
