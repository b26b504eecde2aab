"""The evaluation's outputs: a terminal table, JSON, a markdown report and PNG plots."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from router.telemetry import tables

#: Models drawn by name in the share plot; the rest are summed as "other".
SHARE_TOP = 9


def jsonable(obj: Any, digits: int = 5) -> Any:
    """Floats rounded, infinities and NaN as null, tuples as lists."""
    if isinstance(obj, float):
        return round(obj, digits) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v, digits) for v in obj]
    return obj


def _pm(m: dict[str, Any], key: str, fmt: str) -> str:
    v, s = m.get(key), (m.get("std") or {}).get(key)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return fmt.format(v) + (f" ± {fmt.format(s)}" if s else "")


def rows(report: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(name, metrics, what was chosen on the training folds) for every line of the main table."""
    p = report["policy"]
    yield "policy (objective as given)", p, _objective(p["objective"])
    for name, m in p["operating_points"].items():
        yield f"policy @ {name.replace('_', ' ')}", m, _chosen(m)
    for name, m in report["baselines"].items():
        yield name, m, _chosen(m)
    yield "oracle (hindsight)", report["oracle"], ""


def _objective(o: dict[str, Any]) -> str:
    parts = [f"max_attempts={o['max_attempts']}"]
    if o.get("value_per_completed_usd") is not None:
        parts.append(f"value=${o['value_per_completed_usd']:g}")
    if o.get("target_success") is not None:
        values = [v for v in o.get("value_chosen_on_training") or [] if v is not None]
        found = f" (value ${min(values):.3g}–{max(values):.3g})" if values else ""
        parts.append(f"target_success={o['target_success']:g}{found}")
    if o.get("max_cost_per_task") is not None:
        parts.append(f"max_cost_per_task={o['max_cost_per_task']:g}")
    return ", ".join(parts)


def _chosen(m: dict[str, Any]) -> str:
    chosen = m.get("chosen_on_training") or []
    distinct = list(dict.fromkeys(chosen))
    if not distinct:
        return ""
    return distinct[0] if len(distinct) == 1 else f"{distinct[0]} (+{len(distinct) - 1} other)"


def print_table(report: dict[str, Any], console: Console) -> None:
    setup = report["policy"]["setup"]
    t = Table(title=f"router eval — {setup['mode']}, {setup['tasks']} tasks × {setup['models']} models, "
                    f"retries {setup['retries']}")  # fmt: skip
    for col in (
        "policy / baseline",
        "resolved",
        "$ / task",
        "$ / completed",
        "attempts",
        "chosen on training",
    ):
        t.add_column(
            col,
            justify="left" if col in ("policy / baseline", "chosen on training") else "right",
        )
    for name, m, chosen in rows(report):
        style = "bold" if name.startswith("policy") else ("dim" if name.startswith("single:") else None)
        t.add_row(name, _pm(m, "resolved_rate", "{:.1%}"), _pm(m, "cost_per_task", "{:.4f}"),
                  _pm(m, "cost_per_completed", "{:.4f}"), _pm(m, "mean_attempts", "{:.2f}"), chosen,
                  style=style)  # fmt: skip
    tables.show(console, t)
    for key, title in _frontiers(report):
        f = Table(title=title)
        for col in ("value $", "resolved", "$ / task", "$ / completed", "attempts"):
            f.add_column(col, justify="right")
        for pt in report[key]:
            f.add_row(f"{pt['value']:g}", _pm(pt, "resolved_rate", "{:.1%}"), _pm(pt, "cost_per_task", "{:.4f}"),
                      _pm(pt, "cost_per_completed", "{:.4f}"), _pm(pt, "mean_attempts", "{:.2f}"))  # fmt: skip
        tables.show(console, f)
    for line in target_lines(report):
        console.print(line)


def _frontiers(report: dict[str, Any]) -> list[tuple[str, str]]:
    fa, fr = report["policy"]["setup"].get("verifier_noise") or (0.0, 0.0)
    if "frontier_exact" not in report:
        return [("frontier", "policy frontier (value of a completed task swept), verifier exact")]
    return [("frontier_exact", "policy frontier (value swept), verifier exact (noise 0,0)"),
            ("frontier", f"policy frontier (value swept), verifier noise {fa:g},{fr:g}")]  # fmt: skip


def target_lines(report: dict[str, Any]) -> list[str]:
    tg = report["policy"]["targets"]
    out = []
    if "a_default" in tg:
        a = tg["a_default"]
        out.append(
            f"target (a) default single shot: policy {a['policy_resolved_rate']:.1%} at ${a['policy_cost_per_task']:.4f}/task "
            f"vs the best single model ({', '.join(a['reference'])}) {a['reference_resolved_rate']:.1%} at "
            f"${a['reference_cost_per_task']:.4f} ({a['resolved_gain_points']:+.1f} points at {a['cost_ratio']:.2f}× "
            f"the cost; wanted ≥ +0.0 at ≤ 1.05×): {'MET' if a['met'] else 'not met'}"
        )
    for key, label in (("b_cascades", "(b)"), ("c_noisy_cascades", "(c)")):
        if key not in tg:
            continue
        fa, fr = tg[key]["verifier_noise"]
        noise = f", verifier noise {fa:g},{fr:g}" if key.startswith("c") else ""
        for r in tg[key]["targets"]:
            out.append(
                f"target {label} success {r['target']:.0%}{noise}: policy {r['policy_resolved_rate']:.1%} at "
                f"${r['policy_cost_per_completed']:.4f}/completed vs cascade {r['cascade']} "
                f"{r['cascade_resolved_rate']:.1%} at ${r['cascade_cost_per_completed']:.4f} "
                f"({r['cost_ratio']:.2f}×; wanted ≤ 1.05× at ≥ its resolved): {'MET' if r['met'] else 'not met'}"
            )
    return out


def _frontier_md(points: list[dict[str, Any]]) -> list[str]:
    lines = ["| value $ | resolved | $ / task | $ / completed | attempts |", "|---:|---:|---:|---:|---:|"]
    for pt in points:
        lines.append(f"| {pt['value']:g} | {_pm(pt, 'resolved_rate', '{:.1%}')} | {_pm(pt, 'cost_per_task', '{:.4f}')} | "
                     f"{_pm(pt, 'cost_per_completed', '{:.4f}')} | {_pm(pt, 'mean_attempts', '{:.2f}')} |")  # fmt: skip
    return lines


def targets_table(reports: list[dict[str, Any]]) -> str:
    """The issue's targets as one markdown table (``router eval --targets``), then each frontier."""
    lines = ["| target | wanted | policy | reference | ratio | |", "|---|---|---|---|---:|---|"]
    for rep in reports:
        tg = rep["policy"]["targets"]
        if "a_default" in tg:
            a = tg["a_default"]
            lines.append(
                f"| (a) single shot, default | ≥ best single ({', '.join(a['reference'])}) at ≤ 1.05× its $/task | "
                f"{a['policy_resolved_rate']:.1%} at ${a['policy_cost_per_task']:.4f}/task | "
                f"{a['reference_resolved_rate']:.1%} at ${a['reference_cost_per_task']:.4f} | "
                f"{a['resolved_gain_points']:+.1f} pt, {a['cost_ratio']:.2f}× | {'met' if a['met'] else 'not met'} |"
            )
        for key, label in (("b_cascades", "(b)"), ("c_noisy_cascades", "(c)")):
            for r in (tg.get(key) or {}).get("targets", []):
                noise = " noise 0.2,0.1" if key.startswith("c") else ""
                lines.append(
                    f"| {label} retries 2{noise}, target {r['target']:.0%} | ≤ 1.05× cascade's $/completed at ≥ "
                    f"its resolved | {r['policy_resolved_rate']:.1%} at ${r['policy_cost_per_completed']:.4f} | "
                    f"{r['cascade']}: {r['cascade_resolved_rate']:.1%} at ${r['cascade_cost_per_completed']:.4f} | "
                    f"{r['cost_ratio']:.2f}× | {'met' if r['met'] else 'not met'} |"
                )
    for rep in reports:
        setup = rep["policy"]["setup"]
        for key, title in _frontiers(rep):
            lines += [
                "",
                f"retries {setup['retries']}, {title} ({setup['seconds']} s):",
                "",
                *_frontier_md(rep[key]),
            ]
    return "\n".join(lines) + "\n"


def markdown(report: dict[str, Any], images: dict[str, str]) -> str:
    setup = report["policy"]["setup"]
    lines = [
        "# router eval",
        "",
        f"{setup['mode']} on `{setup['data']}`: {setup['tasks']} tasks × {setup['models']} models, "
        f"retries {setup['retries']}, seed {setup['seed']}. Every number is measured on held-out tasks "
        "(pooled over folds ± std across folds); what a row chose on the training folds is in the last column. "
        f"Fitted task effect (logit sd) per fold: {', '.join(f'{x:g}' for x in setup.get('task_effect_sd', []))}.",
        "",
        "## Targets",
        "",
        *[f"- {line}" for line in target_lines(report)],
        "",
        "## Policy, baselines, oracle",
        "",
        "| policy / baseline | resolved | $ / task | $ / completed | attempts | chosen on training |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m, chosen in rows(report):
        lines.append(f"| {name} | {_pm(m, 'resolved_rate', '{:.1%}')} | {_pm(m, 'cost_per_task', '{:.4f}')} | "
                     f"{_pm(m, 'cost_per_completed', '{:.4f}')} | {_pm(m, 'mean_attempts', '{:.2f}')} | {chosen} |")  # fmt: skip
    for key, title in _frontiers(report):
        lines += ["", f"## {title}", "", *_frontier_md(report[key])]
    for title, name in images.items():
        lines += ["", f"## {title}", "", f"![{title}]({name})"]
    return "\n".join(lines) + "\n"


def plots(report: dict[str, Any], out: Path) -> dict[str, str]:
    """Write the PNGs into ``out``; return {title: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    images = {}
    setup = report["policy"]["setup"]

    fig, ax = plt.subplots(figsize=(11, 7))
    singles = {k[len("single:") :]: m for k, m in report["baselines"].items() if k.startswith("single:")}
    ax.scatter([m["cost_per_task"] for m in singles.values()], [m["resolved_rate"] for m in singles.values()],
               color="0.55", s=22, label="single models", zorder=2)  # fmt: skip
    for name, m in singles.items():
        ax.annotate(name, (m["cost_per_task"], m["resolved_rate"]), fontsize=7, color="0.35",
                    xytext=(3, 2), textcoords="offset points")  # fmt: skip
    front = sorted(report["frontier"], key=lambda p: p["cost_per_task"])
    ax.plot([p["cost_per_task"] for p in front], [p["resolved_rate"] for p in front], "-o", color="tab:blue",
            lw=2, ms=4, label="policy frontier (value of a completed task swept)", zorder=4)  # fmt: skip
    p = report["policy"]
    ax.scatter([p["cost_per_task"]], [p["resolved_rate"]], marker="*", s=260, color="tab:blue",
               edgecolor="black", zorder=5, label="policy (objective as given)")  # fmt: skip
    ops = report["policy"]["operating_points"]
    if ops:
        ax.scatter([m["cost_per_task"] for m in ops.values()], [m["resolved_rate"] for m in ops.values()],
                   marker="D", s=45, facecolor="none", edgecolor="tab:blue", lw=1.5, zorder=5,
                   label="policy operating points (chosen on training folds)")  # fmt: skip
    marks = {"random": ("x", "tab:gray"), "always-cheapest": ("v", "tab:brown"),
             "always-strongest": ("^", "tab:purple")}  # fmt: skip
    for name, (marker, color) in marks.items():
        m = report["baselines"][name]
        ax.scatter(
            [m["cost_per_task"]], [m["resolved_rate"]], marker=marker, s=70, color=color, label=name, zorder=3
        )
    routellm = sorted((m for k, m in report["baselines"].items() if k.startswith("routellm@")),
                      key=lambda m: m["cost_per_task"])  # fmt: skip
    if routellm:
        ax.plot([m["cost_per_task"] for m in routellm], [m["resolved_rate"] for m in routellm], "--s",
                color="tab:orange", ms=5, label="RouteLLM-style threshold (share of strong swept)")  # fmt: skip
    casc = [m for k, m in report["baselines"].items() if k.startswith("cascade")]
    ax.scatter([m["cost_per_task"] for m in casc], [m["resolved_rate"] for m in casc], marker="P", s=70,
               color="tab:green", label="best fixed cascades (chosen on training folds)", zorder=3)  # fmt: skip
    o = report["oracle"]
    ax.scatter([o["cost_per_task"]], [o["resolved_rate"]], marker="*", s=220, color="gold", edgecolor="black",
               label="oracle (hindsight)", zorder=5)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("mean $ per task (log scale; failed attempts included)")
    ax.set_ylabel("share of tasks resolved")
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Cost vs success, {setup['mode']}, retries {setup['retries']} (held-out tasks)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "cost_success.png", dpi=130)
    plt.close(fig)
    images["Cost vs success"] = "cost_success.png"

    fig, ax = plt.subplots(figsize=(11, 6))
    lines = [("policy", p), *[(f"value ${f['value']:g}", f) for f in report["frontier"]]]
    totals: dict[str, float] = {}
    for _, m in lines:
        for model, share in m["share_of_calls"].items():
            totals[model] = totals.get(model, 0.0) + share
    top = [m for m, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:SHARE_TOP] if totals[m] > 0]
    cmap = plt.get_cmap("tab10")
    for row, (_label, m) in enumerate(lines):
        left = 0.0
        for i, model in enumerate([*top, "other"]):
            share = (sum(v for k, v in m["share_of_calls"].items() if k not in top) if model == "other"
                     else m["share_of_calls"][model])  # fmt: skip
            ax.barh(row, share, left=left, color=cmap(i % 10) if model != "other" else "0.8",
                    label=model if row == 0 else None)  # fmt: skip
            left += share
    ax.set_yticks(range(len(lines)), [label for label, _ in lines])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_xlabel("share of LLM calls (agent steps) per model")
    ax.set_title("Where the policy sends the work: the objective as given, and each value")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out / "share_of_calls.png", dpi=130)
    plt.close(fig)
    images["Share of calls per model"] = "share_of_calls.png"
    return images
