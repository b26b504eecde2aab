"""The replay: each task is attempted, and retried on failure, with outcomes looked up in the data.

A chooser names the model of each attempt from what a live router knows at that moment: the
task, the attempt number, the models that already failed it and the money spent so far. It may
return ``None`` to stop (a fixed cascade that has run out of models). The data holds one run per
task × model, so an attempt on a model already tried repeats that run's outcome and cost: a
repeat is never free and never luckier than the first time.

Inside an attempt, an ``Execution`` may stop it early (``router.features.task.attempt``: a per-model cap
on calls, a stop-loss on the label model's reading of the conversation, or a random stop as its
control). Where the run's trajectory is known the stop falls at that call and charges the calls
before it at their recorded cost; elsewhere only a cap can stop it, charging its share of the
run's calls. A per-task budget is enforced as the proxy does: the call that would spend past it
is refused, and the task ends there. A stopped attempt is a failure the router knows of itself.

With a noisy verifier, the chooser learns each finished attempt's outcome only through it: a wrong
result is accepted with probability ``false_accept`` and a right one rejected with
``false_reject`` (seeded per task, attempt and model, so every chooser sees the same verdict on
the same attempt); the label verifier reads the run's conversation with the label model where its
trajectory is known. An accepted attempt ends the task, resolved only if its result was right; a
rejected one counts as a failure to the chooser and the task goes on — unless it was the last
attempt: its result is then what the task ends with, so a right one rejected there still counts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router.features.task.attempt import NONE, AttemptControl
from router.learning.evals.loader import Dataset
from router.learning.training import control

#: (task_id, attempt starting at 1, models that failed this task so far, USD spent so far) → model.
Chooser = Callable[[str, int, tuple[str, ...], float], str | None]
BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class TaskRun:
    task_id: str
    #: The model of each attempt made, in order.
    models: tuple[str, ...]
    #: LLM calls of each attempt (the agent's steps), in the same order.
    calls: tuple[int, ...]
    resolved: bool
    cost: float
    #: Why each attempt was stopped early (None: it ran to its end), in the same order.
    stops: tuple[str | None, ...] = ()

    @property
    def attempts(self) -> int:
        return len(self.models)


class Judge(Protocol):
    def accepts(self, task_id: str, attempt: int, model: str, resolved: bool) -> bool: ...


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


@dataclass(frozen=True, slots=True)
class LabelVerifier:
    """The router's own label model judges a run whose conversation is known (P at its end ≥ the
    model's threshold); ``elsewhere`` judges the rest."""

    verdicts: Mapping[tuple[str, str], bool]
    elsewhere: Verifier = EXACT

    def accepts(self, task_id: str, attempt: int, model: str, resolved: bool) -> bool:
        found = self.verdicts.get((task_id, model))
        return found if found is not None else self.elsewhere.accepts(task_id, attempt, model, resolved)


@dataclass(frozen=True, slots=True)
class Attempted:
    resolved: bool
    cost: float
    calls: int
    stopped: str | None = None


@dataclass(frozen=True)
class Execution:
    """How an attempt runs: per model, its control; per (task, model) the run's calls as its
    trajectory recorded them (per-call costs, the label model's readings), where known; random
    stops in place of stop-losses, for the control they are measured against."""

    controls: Mapping[str, AttemptControl] = field(default_factory=dict)
    known: Mapping[tuple[str, str], control.Run] = field(default_factory=dict)
    random_stops: Mapping[str, control.RandomStop] = field(default_factory=dict)

    def attempt(self, data: Dataset, task_id: str, model: str, budget_left: float | None) -> Attempted:
        o = data.outcome(task_id, model)
        run = self.known.get((task_id, model)) or control.Run(o.resolved, o.cost, o.calls)
        rnd = self.random_stops.get(model)
        got = control.controlled(
            run, self.controls.get(model, NONE), rnd.stop_at(task_id, model) if rnd else None
        )
        if budget_left is not None and got.cost > budget_left:
            # The proxy refuses the call that would spend past the budget: the calls before it are paid.
            k = 0
            while k < got.calls and control.spent(run, k + 1) <= budget_left:
                k += 1
            return Attempted(False, control.spent(run, k), k, BUDGET)
        return Attempted(bool(got.right), got.cost, got.calls, got.stopped)


PLAIN = Execution()


def run_task(
    data: Dataset, task_id: str, choose: Chooser, retries: int, verifier: Judge = EXACT,
    execution: Execution = PLAIN, budget: float | None = None,
) -> TaskRun:  # fmt: skip
    models: list[str] = []
    calls: list[int] = []
    stops: list[str | None] = []
    failed: list[str] = []
    cost = 0.0
    # The result the task would end with if nothing more happened (the last finished attempt's).
    last_right = False
    resolved: bool | None = None
    for attempt in range(1, retries + 2):
        model = choose(task_id, attempt, tuple(failed), cost)
        if model is None:
            break
        a = execution.attempt(data, task_id, model, None if budget is None else budget - cost)
        models.append(model)
        calls.append(a.calls)
        stops.append(a.stopped)
        cost += a.cost
        if a.stopped is not None:
            # Work the router cut off is not submitted: nothing is left in place.
            last_right = False
            if model not in failed:
                failed.append(model)
            if a.stopped == BUDGET:
                break
            continue
        last_right = a.resolved
        if verifier.accepts(task_id, attempt, model, a.resolved):
            resolved = a.resolved
            break
        if model not in failed:
            failed.append(model)
    done = resolved if resolved is not None else last_right
    return TaskRun(task_id, tuple(models), tuple(calls), done, cost, tuple(stops))


def replay(
    data: Dataset, task_ids: Sequence[str], choose: Chooser, retries: int, verifier: Judge = EXACT,
    execution: Execution = PLAIN, budget: float | None = None,
) -> list[TaskRun]:  # fmt: skip
    """Every task in ``task_ids`` under ``choose``, with up to ``retries`` retries after a failure."""
    if retries < 0:
        raise ValueError("retries must be ≥ 0")
    return [run_task(data, t, choose, retries, verifier, execution, budget) for t in task_ids]
