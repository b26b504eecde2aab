"""The replay: each task is attempted, and retried on failure, with outcomes looked up in the data.

A chooser names the model of each attempt from what a live router knows at that moment: the
task, the attempt number, the models that already failed it and the money spent so far. It may
return ``None`` to stop (a fixed cascade that has run out of models). The data holds one run per
task × model, so an attempt on a model already tried repeats that run's outcome and cost: a
repeat is never free and never luckier than the first time.

With a noisy verifier, the chooser learns each attempt's outcome only through it: a wrong result
is accepted with probability ``false_accept`` and a right one rejected with ``false_reject``
(seeded per task, attempt and model, so every chooser sees the same verdict on the same attempt).
An accepted attempt ends the task, resolved only if its result was right; a rejected one counts as
a failure to the chooser, and its work is discarded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.learning.evals.loader import Dataset

#: (task_id, attempt starting at 1, models that failed this task so far, USD spent so far) → model.
Chooser = Callable[[str, int, tuple[str, ...], float], str | None]


@dataclass(frozen=True, slots=True)
class TaskRun:
    task_id: str
    #: The model of each attempt made, in order.
    models: tuple[str, ...]
    #: LLM calls of each attempt (the agent's steps), in the same order.
    calls: tuple[int, ...]
    resolved: bool
    cost: float

    @property
    def attempts(self) -> int:
        return len(self.models)


@dataclass(frozen=True, slots=True)
class Verifier:
    """How the chooser learns an attempt's outcome (perfectly, by default)."""

    false_accept: float = 0.0
    false_reject: float = 0.0
    seed: int = 0

    def accepts(self, task_id: str, attempt: int, model: str, resolved: bool) -> bool:
        if not (self.false_accept or self.false_reject):
            return resolved
        draw = random.Random(f"{self.seed}:{task_id}:{attempt}:{model}").random()
        return draw >= self.false_reject if resolved else draw < self.false_accept


EXACT = Verifier()


def run_task(
    data: Dataset, task_id: str, choose: Chooser, retries: int, verifier: Verifier = EXACT
) -> TaskRun:
    models: list[str] = []
    calls: list[int] = []
    failed: list[str] = []
    cost = 0.0
    resolved = False
    for attempt in range(1, retries + 2):
        model = choose(task_id, attempt, tuple(failed), cost)
        if model is None:
            break
        o = data.outcome(task_id, model)
        models.append(model)
        calls.append(o.calls)
        cost += o.cost
        if verifier.accepts(task_id, attempt, model, o.resolved):
            resolved = o.resolved
            break
        if model not in failed:
            failed.append(model)
    return TaskRun(task_id, tuple(models), tuple(calls), resolved, cost)


def replay(
    data: Dataset, task_ids: Sequence[str], choose: Chooser, retries: int, verifier: Verifier = EXACT
) -> list[TaskRun]:
    """Every task in ``task_ids`` under ``choose``, with up to ``retries`` retries after a failure."""
    if retries < 0:
        raise ValueError("retries must be ≥ 0")
    return [run_task(data, t, choose, retries, verifier) for t in task_ids]
