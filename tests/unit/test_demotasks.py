"""What `router demo --tasks` prints of its run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console

from router.app.demotasks import Source, TaskRun, report


def test_a_backend_the_data_has_no_model_for_is_said_to_get_no_outcomes() -> None:
    # A user who added a cheaper model to policies/examples/local.yaml (the file the demo runs on)
    # saw 262 of 300 tasks on it, "stands for -", 38 labelled, and nothing saying why.
    runs = [TaskRun(f"t{i}", "x", 2, served=Counter({"local-pico": 2})) for i in range(3)]
    runs.append(TaskRun("t9", "x", 2, served=Counter({"local-mini": 2}), success=True))
    console = Console(record=True, width=200)
    report(console, runs, 1.0, Source(Path("data"), [], {}, {}), "sqlite:///router.db", Path("local.yaml"))
    out = console.export_text()
    assert (
        "local-pico stands for no model of the shipped data: its 3 tasks have no outcome, so "
        "`router train` has no labelled attempt of it (the demo's backends: local-nano, local-mini, "
        "local-large, local-claude)"
    ) in out
    assert "local-mini stands for no" not in out
