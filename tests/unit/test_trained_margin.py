"""The margin above a target is in the plan `router train` deploys, not only in the evaluation's
choice: `fit` runs the inner cross-validation `control.learn` runs (on the log's tasks), the
artifact keeps what it chose per target, and the policy's prior plan for a target is chosen there."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from router.learning.training import control
from router.learning.training.dataset import AttemptRow
from router.learning.training.fit import fit
from router.policy.active import objective_for
from router.policy.artifact import Artifact
from router.policy.loading import load_policy
from router.policy.prior import for_target
from tests.unit.test_scopes import M

TARGET = 0.88
MODELS = tuple(f"m{j}" for j in range(8))


def _runs(n: int, seed: int) -> dict[str, dict[str, control.Run]]:
    """Eight models of the same true chance, 0.5, at different prices: on a sample, which order of
    three reaches 88% cheapest is luck (the winner's curse the margin corrects)."""
    rng = random.Random(seed)
    return {
        m: {f"t{i:03d}": control.Run(rng.random() < 0.5, 0.1 * (j + 1), 10) for i in range(n)}
        for j, m in enumerate(MODELS)
    }


def _log(runs: dict[str, dict[str, control.Run]]) -> list[AttemptRow]:
    """The same runs as a log: each task × model a first attempt with an explicit outcome."""
    tasks = sorted(runs[MODELS[0]])

    def row(i: int, t: str, m: str) -> AttemptRow:
        run = runs[m][t]
        return AttemptRow(t, 1, m, {0: 1.0, 1: float(i)}, run.resolved, "explicit", run.cost, 10, 1 / len(MODELS),
                          list(MODELS), ts=float(i))  # fmt: skip

    return [row(i, t, m) for i, t in enumerate(tasks) for m in MODELS]


def _policy(tmp_path: Path) -> Path:
    doc = {"version": 1, "name": "p", "models": [{**M, "id": m, "prices": {"input": 1, "output": 1}} for m in MODELS],
           "routes": [{"match": "auto", "candidates": list(MODELS)}],
           "objective": {"max_attempts": 3, "target_success": TARGET}}  # fmt: skip
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_trained_plan_for_a_target_is_the_one_the_evaluation_chooses_above_it(tmp_path: Path) -> None:
    runs = _runs(200, 5)
    evaluated = control.learn(runs, sorted(runs[MODELS[0]]), 3, TARGET, caps=False, stop_loss=False)
    assert evaluated.margin > 0  # the data is such that the margin matters
    art = Artifact.from_json(fit(_log(runs), max_attempts=3, target=TARGET).to_json(), source="a.json")
    point = next(p for p in art.points[3] if p.target == TARGET)
    # The artifact says where the plan for the target is chosen, as the evaluation chose it.
    assert (point.above, point.longest) == (evaluated.margin, evaluated.longest)
    policy = load_policy(_policy(tmp_path))
    deployed = objective_for(policy, art).prior
    assert deployed == evaluated.plan
    # ... which is not the order chosen at the target itself (what was deployed before).
    assert deployed != for_target(art.frontiers[3], TARGET).models
