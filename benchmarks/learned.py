"""The demo policy with a learned artifact, so the benchmarks measure the router as issue 8 asks:
with the learned policy scoring every request (plan search over calibrated success and cost).

The artifact is fitted by the router's own training code (``router.learning.training.fit``) on synthetic
attempts of the demo's four backends — easy tasks succeed anywhere, hard ones mostly on the large
models, as in ``tests/integration/test_learning.py``, and each task has its own unseen difficulty
(as on SWE-bench, where training finds a task effect of ~2 on the logit scale, so the planner
averages over it) — in about a second, with a fixed seed. Its
weights only decide which backend wins; what a request costs the router is the same for any
artifact of this shape: one score per candidate and a plan search over them.

``python -m benchmarks.learned DIR`` writes ``DIR/policy.yaml`` (the demo policy, the artifact
pinned by sha256) and ``DIR/learned.json``.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import yaml

from router.features.task.vector import task_vector, with_attempt
from router.learning.training.dataset import AttemptRow
from router.learning.training.fit import fit
from router.rollout.promote import promote

ROOT = Path(__file__).resolve().parent.parent
DEMO_POLICY = ROOT / "policies" / "examples" / "local.yaml"

EASY = ("typo", "docstring", "rename", "spelling", "comment", "readme", "wording", "label")
HARD = ("race", "deadlock", "concurrency", "distributed", "lock", "thread", "consistency", "atomic")
FILLER = ("module", "function", "class", "test", "value", "config", "request", "user", "file", "error")
SYSTEM = "You are a careful coding assistant."
#: Model → (P(success) on an easy task, on a hard one, cost of an attempt in USD).
MODELS = {
    "local-nano": (0.85, 0.10, 0.002),
    "local-mini": (0.90, 0.35, 0.01),
    "local-large": (0.95, 0.80, 0.05),
    "local-claude": (0.95, 0.85, 0.12),
}
#: Spread of the tasks' unseen difficulty (logit scale).
TASK_EFFECT = 2.0


def attempts(n_tasks: int = 240, seed: int = 7) -> list[AttemptRow]:
    """Up to three attempts per task, each on a model drawn uniformly (an exploring logger)."""
    rng = random.Random(seed)
    rows: list[AttemptRow] = []
    for i in range(n_tasks):
        hard = i % 2 == 1
        words = [*rng.sample(HARD if hard else EASY, 4), *rng.sample(FILLER, 4)]
        rng.shuffle(words)
        vector = task_vector(f"Task {i}: fix the {' '.join(words)} problem.", SYSTEM, 1, None)
        failed: list[str] = []
        difficulty = rng.gauss(0.0, TASK_EFFECT)
        for attempt in range(1, 4):
            model = rng.choice(list(MODELS))
            easy_p, hard_p, cost = MODELS[model]
            p = hard_p if hard else easy_p
            ok = rng.random() < 1 / (1 + math.exp(difficulty - math.log(p / (1 - p))))
            rows.append(
                AttemptRow(
                    task_id=f"t{i}", attempt=attempt, model=model,
                    vector=with_attempt(vector, attempt), success=ok, label_source="explicit",
                    cost=cost * rng.uniform(0.7, 1.3), n_calls=rng.randint(5, 30),
                    propensity=1 / len(MODELS), actions=list(MODELS), failed_before=list(failed),
                    ts=1_700_000_000.0 + i,
                )
            )  # fmt: skip
            if ok:
                break
            failed.append(model)
    return rows


def write(directory: Path) -> Path:
    """The demo policy pinning a freshly fitted artifact, in ``directory``; returns the policy's path."""
    directory.mkdir(parents=True, exist_ok=True)
    artifact = directory / "learned.json"
    artifact.write_bytes(fit(attempts()).to_json())
    policy = directory / "policy.yaml"
    spec = yaml.safe_load(DEMO_POLICY.read_text(encoding="utf-8"))
    spec["objective"]["exploration"] = {"epsilon": 0.0}  # the demo explores; a benchmark must not
    policy.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    promote(str(artifact), str(policy))
    return policy


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/learned")))
