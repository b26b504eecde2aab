"""`router eval-labels`: the outcome label measured on replayed agent trajectories (tables or JSON).

Only the argument definitions load with the CLI; the replay's imports wait until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from router.learning.labels.replay import Trajectory


def default_trajectories() -> Path:
    from router.learning.labels.replay import DEFAULT_TRAJECTORIES

    beside = Path(__file__).resolve().parents[3] / DEFAULT_TRAJECTORIES
    return beside if beside.is_file() else DEFAULT_TRAJECTORIES


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    """The cross-validated replay's arguments, shared by the commands that replay trajectories."""
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds, grouped by task (default 5)")
    p.add_argument("--seed", type=int, default=0, help="fold shuffle (default 0)")
    p.add_argument("--limit", type=int, help="only the first N trajectories")


def load_trajectories(args: argparse.Namespace) -> tuple[Path, list[Trajectory]]:
    """The trajectories a replay reads (a file, or a directory's ``*.jsonl(.gz)`` files, as
    ``router eval --trajectories`` takes them; checked with the folds before anything loads) and
    their runs, or a ``ConfigError`` that names the file."""
    from router.learning.evals.turns import files
    from router.learning.labels.replay import load

    path: Path = args.trajectories or default_trajectories()
    if not path.exists():
        raise ConfigError(f"{path}: no such trajectories file or directory (pass --trajectories PATH)")
    found = files([path])
    if not found:
        raise ConfigError(f"{path}: no *.jsonl or *.jsonl.gz trajectories file in this directory")
    if args.folds < 2:
        raise ConfigError(f"--folds: expected at least 2, got {args.folds}")
    runs: list[Trajectory] = []
    for f in found:
        if args.limit is not None and len(runs) >= args.limit:
            break
        try:
            runs += load(f, None if args.limit is None else args.limit - len(runs))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{f}: not a trajectories file: {exc}") from exc
    if not runs:  # an empty file: scikit-learn's "requires at least one train/test split" traceback before
        raise ConfigError(f"{path}: holds no trajectories")
    return path, runs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trajectories",
        type=Path,
        help="JSONL(.gz) of agent runs, or a directory of them (default: the shipped SWE-bench runs)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument(
        "--stop-loss", action="store_true", help="also: cost saved vs resolved runs lost, over thresholds"
    )
    p.add_argument(
        "--shape", choices=("tools", "text"), action="append", help="replay only this shape (repeatable)"
    )
    p.add_argument(
        "--model",
        type=Path,
        help="label model artifact whose features are cross-validated (default: shipped)",
    )
    add_replay_arguments(p)
    p.add_argument(
        "--fit", type=Path, metavar="OUT", help="also fit a label model on all trajectories, write it to OUT"
    )


def run(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from router.features.labels.model import LabelModel, default
    from router.learning.labels import evaluate as ev
    from router.learning.labels.replay import SHAPES

    path, trajectories = load_trajectories(args)
    model = LabelModel.load(args.model, None) if args.model else default()
    shapes = tuple(args.shape or SHAPES)
    report = ev.evaluate(
        trajectories, model, shapes=shapes, folds=args.folds, seed=args.seed, with_stop_loss=args.stop_loss
    )
    report["trajectories_file"] = str(path)
    if args.fit:
        report["fitted"] = {
            "path": str(args.fit),
            "sha256": ev.fit_default(trajectories, model, model.features, args.fit),
        }
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        show(report, Console())
    return 0


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def show(report: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    from router.telemetry import tables

    console.print(
        f"[bold]{report['trajectories']}[/] trajectories ({report['resolved']} resolved), "
        f"{report['folds']}-fold CV grouped by task (seed {report['seed']}); features: {', '.join(report['features'])}"
    )
    console.print("labels: model = the label model, CV; steps = a model of the turns alone, CV; rules = the "
                  "hand-weighted label it replaces; shipped = the default model, fitted on these runs (in-sample)")  # fmt: skip
    names = {"cv": "model", "steps": "steps", "rules": "rules", "shipped": "shipped"}
    for shape, per in report["shapes"].items():
        t = Table("label", "request", "runs", "cover", "agree", "const.", "AUC", "Brier", "const.",
                  title=f"{shape} shape: agreement and Brier beside the constant predictor's")  # fmt: skip
        for which in names:
            for c, q in per[which].items():
                t.add_row(
                    names[which], c, str(q["attempts"]), _f(q["coverage"], "{:.0%}"), _f(q.get("agreement"), "{:.0%}"),
                    _f(q.get("agreement_constant"), "{:.0%}"), _f(q.get("auc")), _f(q.get("brier"), "{:.4f}"),
                    _f(q.get("brier_constant"), "{:.4f}"),
                )  # fmt: skip
        tables.show(console, t)
        rel = Table(
            "P bin",
            "attempts",
            "predicted",
            "observed",
            title=f"{shape}: reliability at the last request (CV)",
        )
        for b in per["cv"]["last"]["reliability"]:
            rel.add_row(b["bin"], str(b["n"]), f"{b['predicted']:.2f}", f"{b['observed']:.2f}")
        tables.show(console, rel)
        if "stop_loss" in per:
            s = Table("P <", "runs cut", "resolved lost", "unresolved cut", "$ saved", "of $",
                      title=f"{shape}: stop-loss (cut at the first request with CV P < t)")  # fmt: skip
            for r in per["stop_loss"]:
                s.add_row(f"{r['threshold']:.2f}", str(r["attempts_cut"]), f"{r['resolved_lost']}/{r['resolved']}",
                          str(r["unresolved_cut"]), f"{r['usd_saved']:.2f}", _f(r["share_saved"], "{:.1%}"))  # fmt: skip
            tables.show(console, s)
    if "fitted" in report:
        f = report["fitted"]
        console.print(f"wrote {f['path']} (sha256 {f['sha256']})")
