"""Agent trajectories as the replay reads them: per request, what the label model sees and what it cost.

A trajectory file (``router eval-labels``'s format: one run a line, gzipped or not, with
``instance_id``, ``model_id``, ``resolved`` and the ``messages``) becomes, per (task, model), the
feature vector of the conversation before each LLM call and the provider's cost of each call. A
stop before call k charges the calls before it; the verdict on a finished attempt reads the
conversation as it stands after its last call. Features are summed message by message (the
label's ``Tally``), so a run of n calls is read once, not n times.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from router.errors import ConfigError
from router.features.labels import features
from router.features.labels.model import LabelModel
from router.learning.labels import fit as fitting


@dataclass(frozen=True, slots=True)
class Turns:
    task_id: str
    model: str
    resolved: bool
    #: The label's features before each call (index k: what the router knew at call k+1).
    before: tuple[dict[str, float], ...]
    #: The features of the whole conversation once the attempt ended (what a verdict reads).
    final: dict[str, float]
    #: USD of each call, in order.
    costs: tuple[float, ...]

    @property
    def calls(self) -> int:
        return len(self.costs)


def read(
    messages: Sequence[dict[str, object]],
) -> tuple[list[dict[str, float]], dict[str, float], list[float]]:
    facts = features.conversation(messages)
    tally = features.NO_TALLY
    done = 0
    before: list[dict[str, float]] = []
    costs: list[float] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        tally = tally.plus(facts[done:i])
        done = i
        before.append(tally.vector())
        usage = m.get("usage")
        costs.append(float(usage.get("cost") or 0.0) if isinstance(usage, dict) else 0.0)
    # The verdict reads the run without its submission (the last message is the diff sent back).
    final = tally.plus(facts[done : max(done, len(messages) - 1)]).vector()
    return before, final, costs


def load(paths: Iterable[str | Path], tasks: Iterable[str] | None = None) -> dict[tuple[str, str], Turns]:
    """Every run in the files (a directory: its ``*.jsonl`` and ``*.jsonl.gz``), keyed (task, model)."""
    wanted = set(tasks) if tasks is not None else None
    out: dict[tuple[str, str], Turns] = {}
    for p in files(paths):
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = orjson.loads(line)
                    tid, model = str(obj["instance_id"]), str(obj["model_id"])
                    resolved, messages = bool(obj["resolved"]), list(obj["messages"])
                except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ConfigError(f"{p}:{line_no}: not a trajectory ({exc})") from None
                if wanted is not None and tid not in wanted:
                    continue
                before, final, costs = read(messages)
                out[tid, model] = Turns(tid, model, resolved, tuple(before), final, tuple(costs))
    return out


def files(paths: Iterable[str | Path]) -> list[Path]:
    """The trajectory files named (a directory: its ``*.jsonl`` and ``*.jsonl.gz``), in order."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found += sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")])
        elif p.is_file():
            found.append(p)
        else:
            raise ConfigError(f"{p}: no such trajectory file or directory")
    return found


def samples(runs: Iterable[Turns]) -> list[fitting.Sample]:
    """Every request of every run, each run counting once (as ``router eval-labels`` fits them)."""
    return fitting.per_attempt([
        fitting.Sample(f"{r.task_id}|{r.model}", x, r.resolved) for r in runs for x in (*r.before[1:], r.final)
    ])  # fmt: skip


def label_model(runs: Sequence[Turns], features_: Sequence[str] = fitting.DEFAULT_FEATURES) -> LabelModel:
    """The label model fitted on these runs only (a fold's training tasks)."""
    return fitting.fit(samples(runs), features_)


@dataclass(frozen=True, slots=True)
class Readings:
    """P(success) of each run before each call, and at its end, from one label model."""

    before: dict[tuple[str, str], np.ndarray]
    final: dict[tuple[str, str], float]
    threshold: float


def readings(runs: Mapping[tuple[str, str], Turns], model: LabelModel) -> Readings:
    return Readings(
        {k: np.array([model.p_success(x) for x in r.before]) for k, r in runs.items()},
        {k: model.p_success(r.final) for k, r in runs.items()},
        model.threshold,
    )


def out_of_fold(runs: Mapping[tuple[str, str], Turns], folds: int = 5, seed: int = 0) -> Readings:
    """Each run's readings from a label model fitted without its task (for choosing thresholds on
    the training tasks: a model that has seen a run reads it too well)."""
    keys = sorted(runs)
    tasks = sorted({t for t, _ in keys})
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(tasks)))
    fold_of = {tasks[i]: j % folds for j, i in enumerate(order)}
    before: dict[tuple[str, str], np.ndarray] = {}
    final: dict[tuple[str, str], float] = {}
    threshold = 0.5
    for f in range(folds):
        held = [k for k in keys if fold_of[k[0]] == f]
        if not held:
            continue
        model = label_model([runs[k] for k in keys if fold_of[k[0]] != f])
        got = readings({k: runs[k] for k in held}, model)
        before.update(got.before)
        final.update(got.final)
        threshold = got.threshold
    return Readings(before, final, threshold)
