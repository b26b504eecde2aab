"""`router eval` on a slice of the shipped data: the learned policy must beat the simple policies a user
would compare it with, not only produce the report's keys (cross-validated, read from ``--json``).

"Beats" is measured by cost per completed task, the quantity the router exists to lower: against
random choice it must be lower; against always-cheapest (the cheapest model that resolves enough
of the training tasks) it must be no higher at a resolved rate at least as high.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from typing import Any

import pytest

from router.app.cli import main
from tests.unit.test_evals import slice_of_shipped

MODELS = ["deepseek-v3.2-reasoner", "gpt-5-mini-medium", "gemini-3-pro-preview", "claude-opus-4-5"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = slice_of_shipped(tmp_path_factory.mktemp("eval") / "slice", 40, MODELS)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            ["eval", "--train", str(root), "--folds", "2", "--retries", "1", "--workers", "1", "--json"]
        )
    assert code == 0
    parsed: dict[str, Any] = json.loads(out.getvalue())
    return parsed


def test_policy_beats_random_choice(report: dict[str, Any]) -> None:
    policy, random = report["policy"], report["baselines"]["random"]
    assert policy["cost_per_completed"] < random["cost_per_completed"]


@pytest.mark.xfail(
    strict=True,
    reason="issue 16: on this slice the policy resolves as many tasks as always-cheapest but pays more "
    "per completed one ($0.0782 against $0.0751 at 55%, measured at c03a67e, after routing's objective "
    "landed); remove this mark when the policy closes the gap",
)
def test_policy_beats_always_cheapest(report: dict[str, Any]) -> None:
    policy, cheapest = report["policy"], report["baselines"]["always-cheapest"]
    assert policy["resolved_rate"] >= cheapest["resolved_rate"]
    assert policy["cost_per_completed"] <= cheapest["cost_per_completed"]
