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


def test_demo_tasks_without_the_data_say_where_they_looked(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--tasks", "3", "--data", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "pass --data DIR" in done.stderr, done.stderr
    assert not (tmp_path / "demo.db").exists()  # nothing started
