"""What the router keeps per task: a packed vector (the same to every reader, and small), within a bound."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from router.app.settings import Settings
from router.features.task.tracker import TaskTracker
from router.features.task.vector import Packed, arrays, task_vector, to_json, with_attempt
from router.learning.training.fit import fit
from router.policy.learned import Artifact, LearnedScorer, Objective
from tests.unit.test_plan import rows_for

TASKS = Path(__file__).resolve().parents[2] / "evals" / "data" / "swebench-verified" / "tasks.jsonl"


def issues(n: int) -> list[str]:
    with TASKS.open() as f:
        return [json.loads(line)["problem_statement"] for line, _ in zip(f, range(n), strict=False)]


def test_a_packed_vector_reads_as_the_dict_it_was_made_from() -> None:
    vec = task_vector(issues(1)[0], "You are a coding agent.", 12, "astropy/astropy")
    packed = Packed(vec)
    assert packed == vec and dict(packed.items()) == vec
    assert len(packed) == len(vec) and list(packed) == sorted(vec)
    first = min(vec)
    assert packed[first] == vec[first] and packed.get(-1) is None and first in packed
    with pytest.raises(KeyError):
        packed[10**6]
    assert to_json(packed) == to_json(vec)
    assert with_attempt(packed, 2) == with_attempt(vec, 2)
    idx, vals = arrays(packed)
    assert dict(zip(idx.tolist(), vals.tolist(), strict=True)) == vec
    with pytest.raises(ValueError):
        vals[0] = 1.0  # shared with the scorer's memory: read-only


def test_the_scorer_answers_the_same_for_a_packed_vector() -> None:
    artifact = Artifact.from_bytes(orjson.dumps(fit(rows_for(40))), source="t", expected_sha256=None)
    scorer = LearnedScorer(artifact, Objective(max_attempts=3))
    for text in ("fix the race deadlock 7", "fix the typo docstring 8", *issues(5)):
        vec = task_vector(text)
        for attempt in (1, 2):
            plan, opts = scorer.plan(vec, ["cheap", "strong"], attempt=attempt)
            plan_p, opts_p = scorer.plan(Packed(vec), ["cheap", "strong"], attempt=attempt)
            assert plan_p == plan and opts_p == opts
        assert artifact.models["cheap"].p_success(Packed(vec)) == pytest.approx(
            artifact.models["cheap"].p_success(vec), rel=1e-12
        )


def test_a_remembered_task_costs_a_few_kilobytes() -> None:
    # Real issues hash to ~200 features; the tracker remembers up to 100k tasks.
    texts = issues(100)
    features = sum(len(task_vector(t)) for t in texts)

    def bytes_per_feature(make: Callable[[str], object]) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = [make(t) for t in texts]
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(kept) == len(texts)
        return (after - before) / features

    assert bytes_per_feature(lambda t: Packed(task_vector(t))) < 16
    assert bytes_per_feature(task_vector) > 60  # a dict of Python numbers: why it is packed


def test_the_tracker_forgets_the_least_recently_seen_task_past_its_bound() -> None:
    tracker = TaskTracker(max_tasks=2)
    tracker.get("a").attempt = 2
    tracker.get("b")
    tracker.get("a")  # seen again: now "b" is the oldest
    tracker.get("c")
    assert tracker.peek("b") is None and tracker.peek("a") is not None and tracker.peek("a").attempt == 2
    with pytest.raises(ValidationError, match="max_tasks"):
        Settings(max_tasks=0)
