"""LiteLLM's own proxy, the comparison point: its own virtualenv, a config for the fake upstream.

It is installed once into ``benchmarks/.venv-litellm`` (``litellm[proxy]`` from PyPI, about a
minute), apart from the router's virtualenv so that the proxy extras' pins never touch the
router's dependencies. It runs as issue 8 measured it: one worker, no database, no callbacks,
no master key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

VENV = Path(__file__).resolve().parent / ".venv-litellm"
PACKAGE = "litellm[proxy]"
#: Requested model name → (litellm model, whether it speaks Anthropic) for each scenario.
MODELS = {
    "auto": ("openai/nano-model", False),
    "local-claude": ("anthropic/claude-local", True),
    "claude-sonnet-4-5": ("openai/nano-model", False),
}


def executable(venv: Path = VENV) -> Path:
    return venv / "bin" / "litellm"


def ensure_installed(venv: Path = VENV) -> Path:
    """The proxy's executable, installing it first if needed."""
    exe = executable(venv)
    if exe.exists():
        return exe
    print(f"installing {PACKAGE} into {venv} (once; about a minute)...", file=sys.stderr, flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, PACKAGE], check=True)
    if not exe.exists():
        raise RuntimeError(f"{PACKAGE} installed but {exe} is missing")
    return exe


def version(venv: Path = VENV) -> str:
    python = venv / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "unknown"


def write_config(path: Path, upstream_url: str) -> Path:
    models = [
        {
            "model_name": name,
            "litellm_params": {
                "model": model,
                "api_base": upstream_url if anthropic else upstream_url + "/v1",
                "api_key": "sk-bench",
            },
        }
        for name, (model, anthropic) in MODELS.items()
    ]
    config = {
        "model_list": models,
        "litellm_settings": {"drop_params": True},
        # Open mode, as the router runs in the benchmark: no key, so no key checks either side.
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def argv(config: Path, port: int, venv: Path = VENV) -> list[str]:
    return [str(executable(venv)), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]  # fmt: skip


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """No database, no remote cost map, no telemetry: nothing but the proxy itself."""
    env = {k: v for k, v in base.items() if not k.startswith(("LITELLM_", "DATABASE_", "OTEL_", "REDIS_"))}
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_TELEMETRY="False",
        DISABLE_ADMIN_UI="True",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def available(venv: Path = VENV) -> bool:
    return os.access(executable(venv), os.X_OK)
