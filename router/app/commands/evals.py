"""`router eval`: offline evaluation of the learned policy on recorded agent outcomes.

Only the argument definitions load with the CLI; the evaluation's imports (scikit-learn,
matplotlib) wait until the command runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.errors import ConfigError
from router.learning.evals.loader import DEFAULT_DATA, default_data_dir

if TYPE_CHECKING:
    from router.learning.evals.runner import EvalSettings


def _relative(path: Path) -> Path:
    # Reports name the shipped data as a checkout would, not by this machine's absolute path.
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", type=Path, default=None, help=f"data directory (default {DEFAULT_DATA})")
    p.add_argument("--test", type=Path, help="held-out data directory; without it, N-fold cross-validation")
    p.add_argument("--retries", type=int, default=None, help="retries after a failed attempt (default 0)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="fold shuffle and random baseline (default 0)")
    p.add_argument("--target-success", type=float, help="share of all tasks to complete: the value of a completed task is calibrated on the training folds")  # fmt: skip
    p.add_argument("--value-usd", type=float, help="what a completed task is worth (USD): the policy maximises value × P(success) − cost")  # fmt: skip
    p.add_argument("--max-cost-per-task", type=float, help="per-task budget in USD the policy plans within")
    p.add_argument("--verifier-noise", metavar="FA,FR", help="outcomes reach the policy through a verifier that accepts a wrong result with probability FA and rejects a right one with FR (default 0,0)")  # fmt: skip
    p.add_argument("--config", help="take the objective (max_attempts, value_per_completed_usd or target_success, max_cost_per_task) from this policy file; flags override")  # fmt: skip
    p.add_argument("--targets", action="store_true", help="the issue's targets in one table: --retries 0, --retries 2, and --retries 2 with --verifier-noise 0.2,0.1 (three cross-validations)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--out", type=Path, help="write report.md, report.json and PNG plots here")
    p.add_argument("--workers", type=int, default=None, help="processes for the folds (default: up to 2)")


def settings_from(args: argparse.Namespace) -> EvalSettings:
    from router.learning.evals import runner

    retries, value, target, budget = args.retries, args.value_usd, args.target_success, args.max_cost_per_task
    if args.config:
        from router.policy.loading import load_policy

        o = load_policy(args.config).spec.objective
        retries = o.max_attempts - 1 if retries is None else retries
        if value is None and target is None:
            value, target = o.value_per_completed_usd, o.target
        budget = o.max_cost_per_task if budget is None else budget
    retries = 0 if retries is None else retries
    if not 0 <= retries <= 9:
        raise ConfigError(f"--retries: expected 0-9, got {retries}")
    if args.folds < 2:
        raise ConfigError(f"--folds: expected at least 2, got {args.folds}")
    if value is not None and target is not None:
        raise ConfigError("--value-usd and --target-success: give one (a target is turned into a value)")
    if target is not None and not 0 < target < 1:
        raise ConfigError(f"--target-success: expected a share in (0, 1), got {target}")
    if value is not None and value <= 0:
        raise ConfigError(f"--value-usd: expected dollars > 0, got {value}")
    if budget is not None and budget <= 0:
        raise ConfigError(f"--max-cost-per-task: expected dollars > 0, got {budget}")
    extra: dict[str, Any] = {} if args.workers is None else {"workers": max(1, args.workers)}
    return runner.EvalSettings(retries=retries, folds=args.folds, seed=args.seed, value=value, target_success=target,
                           max_cost_per_task=budget, noise=_noise(args.verifier_noise), **extra)  # fmt: skip


def _noise(raw: str | None) -> tuple[float, float]:
    if raw is None:
        return (0.0, 0.0)
    try:
        fa, fr = (float(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError(f"--verifier-noise: expected FA,FR (two probabilities), got {raw!r}") from None
    if not (0 <= fa < 1 and 0 <= fr < 1):
        raise ConfigError(f"--verifier-noise: expected probabilities in [0, 1), got {raw!r}")
    return (fa, fr)


def run_eval(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console

    from router.learning.evals import loader, render, runner

    settings = settings_from(args)
    started = time.monotonic()
    train = loader.load(args.train or _relative(default_data_dir()))
    if args.targets:
        return _targets(train, settings, args.json)
    if args.test is not None:
        result = runner.train_test(train, loader.load(args.test), settings)
    else:
        if settings.folds > len(train.tasks):
            raise ConfigError(f"--folds {settings.folds}: {train.source} has only {len(train.tasks)} tasks")
        result = runner.cross_validate(train, settings)
    result["policy"]["setup"]["seconds"] = round(time.monotonic() - started, 1)
    clean = render.jsonable(result)
    if args.out is not None:
        out: Path = args.out
        images = render.plots(result, out)
        (out / "report.md").write_text(render.markdown(result, images), encoding="utf-8")
        (out / "report.json").write_bytes(orjson.dumps(clean, option=orjson.OPT_INDENT_2))
    if args.json:
        sys.stdout.write(orjson.dumps(clean).decode() + "\n")
    else:
        # A pipe gets the full table too, not 80 columns of wrapped cells.
        console = Console() if sys.stdout.isatty() else Console(width=170)
        render.print_table(result, console)
        if args.out is not None:
            console.print(f"wrote {args.out}/report.md, report.json, cost_success.png, share_of_calls.png")
    return 0


#: What ``--targets`` runs: (retries, verifier noise).
TARGET_RUNS = ((0, (0.0, 0.0)), (2, (0.0, 0.0)), (2, (0.2, 0.1)))


def _targets(train: Any, settings: EvalSettings, as_json: bool) -> int:
    """The three cross-validations the issue's targets are stated on, and one table of them."""
    import dataclasses

    import orjson

    from router.learning.evals import render, runner

    results = []
    for retries, noise in TARGET_RUNS:
        started = time.monotonic()
        run = dataclasses.replace(settings, retries=retries, noise=noise, value=None, target_success=None)
        result = runner.cross_validate(train, run)
        result["policy"]["setup"]["seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
    if as_json:
        sys.stdout.write(
            orjson.dumps(render.jsonable([r["policy"]["targets"] for r in results])).decode() + "\n"
        )
    else:
        sys.stdout.write(render.targets_table(results))
    return 0
