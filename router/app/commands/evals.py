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
    p.add_argument("--trajectories", type=Path, help="agent trajectories (a file or a directory of *.jsonl[.gz]): the replay stops an attempt where its run is known (caps, stop-loss) and charges only the calls made; turns on the in-attempt control evaluation")  # fmt: skip
    p.add_argument("--test-trajectories", type=Path, help="the trajectories the replay reads on the test folds (default: --trajectories); --trajectories is then only fitted on (the label model, caps and stop-loss), each fold reading only its training tasks' runs")  # fmt: skip
    p.add_argument("--verifier", choices=("exact", "labels"), default=None, help="who judges a finished attempt: the recorded outcome (exact, with --verifier-noise) or the router's own label model where a trajectory exists (labels; --verifier-noise elsewhere)")  # fmt: skip
    p.add_argument("--plot", type=Path, help="with --trajectories or --targets: write the frontier plot (resolved vs $ per completed task) here (PNG)")  # fmt: skip
    p.add_argument("--targets", action="store_true", help="the targets in one table: the default single shot (--retries 0), up to 4 attempts with caps and stop-loss (--retries 3, shipped trajectories), and the same with --verifier-noise 0.3,0.2 (three cross-validations)")  # fmt: skip
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
        return _targets(train, settings, args)
    if args.trajectories is not None or args.test_trajectories is not None or args.verifier == "labels":
        return _control(train, settings, args)
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


def default_trajectories() -> Path:
    """The shipped trajectories (beside the shipped data)."""
    return default_data_dir().parent / "trajectories"


def _control_settings(settings: EvalSettings, retries: int, verifier: str, noise: tuple[float, float]) -> Any:
    from router.learning.evals import attempts

    extra: dict[str, Any] = {"workers": settings.workers}
    return attempts.ControlSettings(retries=retries, folds=settings.folds, seed=settings.seed, verifier=verifier,
                             noise=noise, **extra)  # fmt: skip


def _control(train: Any, settings: EvalSettings, args: argparse.Namespace) -> int:
    """Caps, stop-loss and escalation against fixed cascades (``router.learning.evals.attempts``)."""
    import orjson

    from router.learning.evals import attempts, controlview, render

    if args.test is not None:
        raise ConfigError("--trajectories/--verifier labels: cross-validation only for now (drop --test)")
    path = args.trajectories or default_trajectories()
    known, test_known = _trajectories(train, args)
    verifier = args.verifier or "exact"
    if verifier == "labels" and not known:
        raise ConfigError(f"--verifier labels: no trajectory in {path} is of a task in {train.source}")
    retries = settings.retries if args.retries is not None or args.config else 3
    result = attempts.cross_validate(
        train, known, _control_settings(settings, retries, verifier, settings.noise), test_known
    )
    if args.plot is not None:
        controlview.plot([result], args.plot)
    if args.json:
        sys.stdout.write(orjson.dumps(render.jsonable(result)).decode() + "\n")
    else:
        sys.stdout.write(controlview.table(result))
        if args.plot is not None:
            sys.stdout.write(f"wrote {args.plot}\n")
    return 0


def _trajectories(train: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """(runs fitted on, runs the test folds replay; None: the same)."""
    from router.learning.evals import turns

    path = args.trajectories or default_trajectories()
    known = turns.load([path], train.task_ids)
    if args.test_trajectories is None:
        return known, None
    test_known = turns.load([args.test_trajectories], train.task_ids)
    if not test_known:
        raise ConfigError(
            f"--test-trajectories: no trajectory in {args.test_trajectories} is of a task in {train.source}"
        )
    return known, test_known


#: What ``--targets`` runs with caps and stop-loss: (retries, verifier, noise).
CONTROL_RUNS = ((3, "exact", (0.0, 0.0)), (3, "exact", (0.3, 0.2)))


def _targets(train: Any, settings: EvalSettings, args: argparse.Namespace) -> int:
    """The cross-validations the targets are stated on, and one table of them."""
    import dataclasses

    import orjson

    from router.learning.evals import attempts, controlview, render, runner

    started = time.monotonic()
    single = runner.cross_validate(
        train, dataclasses.replace(settings, retries=0, noise=(0.0, 0.0), value=None, target_success=None)
    )
    single["policy"]["setup"]["seconds"] = round(time.monotonic() - started, 1)
    known, test_known = _trajectories(train, args)
    runs = [
        attempts.cross_validate(
            train, known, _control_settings(settings, retries, verifier, noise), test_known
        )
        for retries, verifier, noise in CONTROL_RUNS
    ]
    if args.plot is not None:
        controlview.plot(runs, args.plot)
    if args.json:
        out = {"single": single["policy"]["targets"], "control": [r["targets"] for r in runs]}
        sys.stdout.write(orjson.dumps(render.jsonable(out)).decode() + "\n")
    else:
        sys.stdout.write(controlview.targets_table(single, runs))
        sys.stdout.write("\n" + prior_default(single) + "\n")
        for r in runs:
            sys.stdout.write("\n" + controlview.table(r))
    return 0


def prior_default(single: dict[str, Any]) -> str:
    """Which model the default single shot served, per fold (the best single model unless a
    deviation paid out of fold)."""
    from router.learning.evals import controlview

    best = single["baselines"]["best-single"].get("chosen_on_training") or []
    shares = single["policy"]["share_of_attempts"]
    served = sorted(((v, m) for m, v in shares.items() if v > 0), reverse=True)
    top = ", ".join(f"{m} {v:.1%}" for v, m in served[:3])
    return (f"default single shot: the best single model on each fold's training tasks is "
            f"{controlview.folds_chosen(best)}; the policy's attempts went to {top}")  # fmt: skip
