"""`router eval-sizes`: the router's size and cost estimates on replayed agent trajectories (tables or JSON).

Only the argument definitions load with the CLI; the replay's imports wait until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from router.app.commands.labels import add_replay_arguments, load_trajectories
from router.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trajectories",
        type=Path,
        help="JSONL(.gz) of agent runs with usage, or a directory of them (default: the shipped SWE-bench runs)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    add_replay_arguments(p)
    p.add_argument(
        "--per-request", type=Path, metavar="FILE", help="also write one JSON line per request here"
    )


def run(args: argparse.Namespace) -> int:
    import orjson

    from router.learning.evals import sizes

    path, trajectories = load_trajectories(args)
    if len(trajectories) < args.folds:
        raise ConfigError(f"--folds {args.folds}: {path} has only {len(trajectories)} trajectories")
    try:
        report, rows = sizes.cross_validate(trajectories, folds=args.folds, seed=args.seed)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: an assistant turn without usable usage: {exc!r}") from exc
    report["trajectories_file"] = str(path)
    if args.per_request is not None:
        with args.per_request.open("wb") as f:
            for line in sizes.per_request(rows):
                f.write(orjson.dumps(line) + b"\n")
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(markdown(report))
    return 0


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.2%}"


def _n(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def markdown(report: dict[str, Any]) -> str:
    """The report as two Markdown tables: prompt size and fit beside the baselines, then output and cost."""
    windows = list(report["fit"]["false_fits"])
    head = ["estimate", "anchored median error", "unanchored median error"]
    head += [f"false fits {int(w) // 1024}k" for w in windows] + [
        f"false excludes {int(w) // 1024}k" for w in windows
    ]
    setup = report.get("setup")
    how = f"; {setup['folds']}-fold cross-validation grouped by task (seed {setup['seed']})" if setup else ""
    lines = [f"{report['requests']} requests of {report['tasks']} tasks{how}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    named = [("router (learned, held out)" if setup else "router", report)]
    if "priors" in report:
        named.append(("router (priors)", report["priors"]))
    named += [(name, b) for name, b in report["baselines"].items()]
    for name, r in named:
        p, fit = r["prompt"], r["fit"]
        cells = [name, _pct(p["anchored"]["median_ape"]), _pct(p["unanchored"]["median_ape"])]
        cells += [str(fit["false_fits"][w]) for w in windows] + [
            str(fit["false_excludes"][w]) for w in windows
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| estimate | output sum ratio | output median error | cost sum ratio | cost median error "
                  "| cached share est. / reported | µs per estimate (median, p90) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in named[: 2 if "priors" in report else 1]:
        o, c, k, t = r["output"], r["cost"], r["cache"], r["time"]
        lines.append(
            f"| {name} | {_n(o['sum_ratio'])} | {_pct(o['median_ape'])} | {_n(c['sum_ratio'])} | {_pct(c['median_ape'])} "
            f"| {_pct(k['share_est'])} / {_pct(k['share'])} | {_n(t['median_us'], '{:.1f}')}, {_n(t['p90_us'], '{:.1f}')} |"
        )
    if "cost_candidates" in report:
        lines += ["", "| cost estimate (held out) | cost sum ratio | cost median error |", "|---|---|---|"]
        lines.append(f"| router | {_n(report['cost']['sum_ratio'])} | {_pct(report['cost']['median_ape'])} |")
        for name, c in report["cost_candidates"].items():
            lines.append(f"| {name} | {_n(c['sum_ratio'])} | {_pct(c['median_ape'])} |")
        t = report["time"]
        lines += ["", f"µs per estimate with the turn's cell (turn_shape, turn_cell): {_n(t['median_us_with_turn'], '{:.1f}')} "
                      f"median, against {_n(t['median_us'], '{:.1f}')} without (the same calls)"]  # fmt: skip
    return "\n".join(lines) + "\n"
