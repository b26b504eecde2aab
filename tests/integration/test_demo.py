"""`router demo` as a new user runs it: a real process, the local fake provider, the log it leaves."""

from __future__ import annotations

import os
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
