"""Offline outcome data: tasks, models, and one outcome per (task, model), validated on load.

A data directory holds ``tasks.jsonl`` (one task a line: ``instance_id``, ``repo``,
``problem_statement``), ``models.csv`` (``model_id`` and list prices per 1M tokens) and
``swe_outcomes.csv`` (``instance_id``, ``model_id``, ``resolved``, ``cost_usd``,
``api_calls``). Every task must have an outcome for every model: the replay looks up whatever
the policy chooses. Errors name the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from router.errors import ConfigError

TASKS = "tasks.jsonl"
MODELS = "models.csv"
OUTCOMES = "swe_outcomes.csv"
MODEL_COLUMNS = ("model_id", "usd_per_m_input", "usd_per_m_output")
OUTCOME_COLUMNS = ("instance_id", "model_id", "resolved", "cost_usd", "api_calls")

#: The data shipped with the repository (relative to the checkout).
DEFAULT_DATA = Path("evals") / "data" / "swebench-verified"


def default_data_dir() -> Path:
    """The shipped data: beside the package in a checkout, else relative to the working directory."""
    beside = Path(__file__).resolve().parents[3] / DEFAULT_DATA
    return beside if beside.is_dir() else DEFAULT_DATA


class DataError(ConfigError):
    """An evaluation data directory is missing a file or holds a bad value (file:line: column)."""


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    repo: str
    problem_statement: str
    #: Annotator's after-the-fact estimate: for analysis only, never a routing feature.
    difficulty: str | None = None


@dataclass(frozen=True, slots=True)
class Model:
    id: str
    usd_per_m_input: float
    usd_per_m_output: float
    usd_per_m_cached_input: float | None = None
    org: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    resolved: bool
    cost: float
    calls: int


@dataclass(frozen=True)
class Dataset:
    source: str
    tasks: list[Task]
    models: list[Model]
    outcomes: dict[tuple[str, str], Outcome] = field(repr=False)

    @property
    def task_ids(self) -> list[str]:
        return [t.id for t in self.tasks]

    @property
    def model_ids(self) -> list[str]:
        return [m.id for m in self.models]

    def outcome(self, task_id: str, model_id: str) -> Outcome:
        return self.outcomes[(task_id, model_id)]


def load(directory: str | Path) -> Dataset:
    """Read and validate a data directory; raise ``DataError`` naming file, line and column."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory (expected {TASKS}, {MODELS}, {OUTCOMES})")
    missing = [n for n in (TASKS, MODELS, OUTCOMES) if not (root / n).is_file()]
    if missing:
        raise DataError(f"{root}: missing {', '.join(missing)}")
    tasks = _tasks(root / TASKS)
    models = _models(root / MODELS)
    outcomes = _outcomes(root / OUTCOMES, {t.id for t in tasks}, {m.id for m in models})
    for t in tasks:
        for m in models:
            if (t.id, m.id) not in outcomes:
                raise DataError(
                    f"{root / OUTCOMES}: no row for instance_id {t.id!r} × model_id {m.id!r} "
                    f"(every task needs an outcome for every model in {MODELS})"
                )
    return Dataset(str(root), tasks, models, outcomes)


def _tasks(path: Path) -> list[Task]:
    tasks: list[Task] = []
    seen: set[str] = set()
    for line_no, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise DataError(f"{where}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object")
        for key in ("instance_id", "repo", "problem_statement"):
            value = obj.get(key)
            if not isinstance(value, str) or not value:
                raise DataError(f"{where}: {key}: expected a non-empty string, got {value!r:.60}")
        if obj["instance_id"] in seen:
            raise DataError(f"{where}: instance_id: duplicate {obj['instance_id']!r}")
        seen.add(obj["instance_id"])
        difficulty = obj.get("difficulty")
        tasks.append(Task(obj["instance_id"], obj["repo"], obj["problem_statement"],
                          difficulty if isinstance(difficulty, str) else None))  # fmt: skip
    if not tasks:
        raise DataError(f"{path}: no tasks")
    return tasks


def _models(path: Path) -> list[Model]:
    models: list[Model] = []
    for line_no, row in _csv_rows(path, MODEL_COLUMNS):
        where = f"{path}:{line_no}"
        mid = _text(row, "model_id", where)
        if any(m.id == mid for m in models):
            raise DataError(f"{where}: model_id: duplicate {mid!r}")
        cached = (row.get("usd_per_m_cached_input") or "").strip()
        models.append(
            Model(
                id=mid,
                usd_per_m_input=_number(row, "usd_per_m_input", where),
                usd_per_m_output=_number(row, "usd_per_m_output", where),
                usd_per_m_cached_input=_number(row, "usd_per_m_cached_input", where) if cached else None,
                org=(row.get("org") or "").strip(),
            )
        )
    if not models:
        raise DataError(f"{path}: no models")
    return models


def _outcomes(path: Path, tasks: set[str], models: set[str]) -> dict[tuple[str, str], Outcome]:
    out: dict[tuple[str, str], Outcome] = {}
    for line_no, row in _csv_rows(path, OUTCOME_COLUMNS):
        where = f"{path}:{line_no}"
        task, model = _text(row, "instance_id", where), _text(row, "model_id", where)
        if task not in tasks:
            raise DataError(f"{where}: instance_id: {task!r} is not in {TASKS}")
        if model not in models:
            raise DataError(f"{where}: model_id: {model!r} is not in {MODELS}")
        if (task, model) in out:
            raise DataError(f"{where}: duplicate row for {task!r} × {model!r}")
        resolved = (row.get("resolved") or "").strip()
        if resolved not in ("0", "1"):
            raise DataError(f"{where}: resolved: expected 0 or 1, got {resolved!r}")
        calls = _number(row, "api_calls", where)
        if calls != int(calls):
            raise DataError(f"{where}: api_calls: expected a whole number, got {calls!r}")
        out[(task, model)] = Outcome(resolved == "1", _number(row, "cost_usd", where), int(calls))
    return out


def _lines(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text: {exc.reason}") from None


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        absent = [c for c in required if c not in header]
        if absent:
            raise DataError(f"{path}:1: missing column(s) {', '.join(absent)} (header: {', '.join(header)})")
        try:
            for row in reader:
                if None in row:
                    raise DataError(f"{path}:{reader.line_num}: more fields than the header has")
                yield reader.line_num, row
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text: {exc.reason}") from None


def _text(row: dict[str, str], column: str, where: str) -> str:
    value = (row.get(column) or "").strip()
    if not value:
        raise DataError(f"{where}: {column}: empty")
    return value


def _number(row: dict[str, str], column: str, where: str) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise DataError(f"{where}: {column}: expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise DataError(f"{where}: {column}: expected a finite number ≥ 0, got {raw!r}")
    return value
