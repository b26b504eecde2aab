"""What the in-attempt control evaluation prints: its table, the issue's targets, the frontier plot."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Frontier lines of the plot: (sweep key, label, matplotlib style).
LINES = (
    ("cascade", "best fixed cascade (grid search on the training folds' outcomes)", "--o"),
    ("cascade+caps", "best fixed cascade with learned caps", "-.s"),
    ("policy", "policy: caps, stop-loss, escalation", "-D"),
    # Under a noisy verifier only: the cascade a deployment could choose, on the same verdicts.
    ("cascade, chosen on verdicts", "best fixed cascade chosen on the verdicts", ":^"),
)


def _f(v: Any, fmt: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def folds_chosen(chosen: Sequence[str]) -> str:
    """Each fold's choice, the same ones counted: 'a → b (×3); c → d (×2)'."""
    counts = Counter(chosen)
    return "; ".join(f"{name} (×{n})" if n > 1 else name for name, n in counts.items())


def table(result: Mapping[str, Any]) -> str:
    s = result["setup"]
    noise = s["verifier_noise"]
    lines = [
        f"{s['folds']}-fold CV, seed {s['seed']}, {s['tasks']} tasks × {s['models']} models, up to "
        f"{s['retries'] + 1} attempts, verifier {s['verifier']}"
        + (f", noise {noise[0]:g},{noise[1]:g}" if any(noise) else "")
        + f", {s['trajectories']} trajectories"
        + (
            f" ({s['test_trajectories']} for the test folds)"
            if s.get("test_trajectories", s["trajectories"]) != s["trajectories"]
            else ""
        ),
        "runs fitted on per fold (training tasks only): "
        + ", ".join(str(n) for n in s.get("trajectories_fitted", []))
        + "; runs the test replay read per fold: "
        + ", ".join(str(n) for n in s.get("trajectories_replayed", [])),
        "",
        "| row | resolved | $ / task | $ / completed | attempts | each fold's order (chosen on its training folds) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m in result["rows"].items():
        lines.append(
            f"| {name} | {_f(m['resolved_rate'], '{:.1%}')} | {_f(m['cost_per_task'], '${:.4f}')} | "
            f"{_f(m['cost_per_completed'], '${:.4f}')} | {_f(m['mean_attempts'], '{:.2f}')} | "
            f"{folds_chosen(m.get('chosen_on_training') or [])} |"
        )
    lines += ["", "Learned per fold (caps in calls; stop-loss thresholds kept):", ""]
    for i, fold in enumerate(result["learned"], 1):
        for target, got in fold.items():
            caps = ", ".join(f"{m} {c}" for m, c in sorted(got["caps"].items()) if c) or "none"
            stops = ", ".join(f"{m} < {t:g}" for m, t in got["stop_loss"].items()) or "none"
            tried = "; ".join(
                f"{m}: best {r['threshold']:g} → ${r['cost_per_completed']:.4f} vs ${r['without']:.4f} without, "
                f"${r['random_stop']:.4f} random"
                for m, r in got["stop_loss_trials"].items()
                if "threshold" in r and r.get("random_stop") is not None
            )
            margin = got.get("margin")
            chosen_at = (
                f"; chosen at the target + {100 * margin:.1f} pt among orders of up to {got.get('longest')} (inner folds)"
                if margin is not None
                else ""
            )
            # Under a noisy verifier: what the verdicts made of the order, against the outcomes.
            seen = got.get("on_training")
            read = (
                f"; its order resolves {seen['estimated']:.1%} of the training tasks by the verdicts, "
                f"{seen['true']:.1%} on their true outcomes (the best fixed order there: {seen['best_fixed']:.1%})"
                if seen
                else ""
            )
            lines.append(f"- fold {i}, target {float(target):.0%}: caps {caps}; stop-loss {stops}{chosen_at}{read}"
                         + (f" (tried {tried})" if tried else ""))  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The frontier (resolved vs $ per completed task) of each row over the swept targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 5.5), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        s = result["setup"]
        for key, label, style in LINES:
            if key not in result["sweep"]:
                continue
            pts = [p for p in result["sweep"][key] if p["cost_per_completed"] is not None]
            pts = [p for p in pts if math.isfinite(p["cost_per_completed"])]
            ax.plot(
                [p["cost_per_completed"] for p in pts], [p["resolved_rate"] for p in pts], style, label=label
            )
        ax.set_xscale("log")
        ax.set_xlabel("$ per completed task (log scale)")
        ax.set_ylabel("share of held-out tasks resolved")
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        noise = s["verifier_noise"]
        ax.set_title(f"up to {s['retries'] + 1} attempts, verifier {s['verifier']}"
                     + (f" noise {noise[0]:g},{noise[1]:g}" if any(noise) else ""))  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def targets_table(single: Mapping[str, Any] | None, runs: Sequence[Mapping[str, Any]]) -> str:
    """(a) from the single-shot run; (b), (c) from the exact-verifier run; (d) from the noisy one."""
    lines = ["| target | wanted | policy | reference | ratio | |", "|---|---|---|---|---:|---|"]
    if single is not None:
        a = single["policy"]["targets"].get("a_default")
        if a is not None:
            lines.append(
                f"| (a) single shot, default | ≥ the best single model's resolved at ≤ 1.05× its $/task | "
                f"{a['policy_resolved_rate']:.1%} at ${a['policy_cost_per_task']:.4f}/task | "
                f"{', '.join(a['reference'])}: {a['reference_resolved_rate']:.1%} at ${a['reference_cost_per_task']:.4f} | "
                f"{a['resolved_gain_points']:+.1f} pt, {a['cost_ratio']:.2f}× | {'met' if a['met'] else 'not met'} |"
            )
    for result in runs:
        s = result["setup"]
        noisy = any(s["verifier_noise"]) or s["verifier"] != "exact"
        ref = f"cascade{3}"
        for target, c in result["targets"].items():
            t = float(target)
            policy = result["rows"][f"policy@{t:.0%}"]
            if noisy:
                fa, fr = s["verifier_noise"]
                n = s["retries"] + 1
                against = [(f"cascade{n}", "best fixed cascade (chosen on true outcomes)", "not_below_cascade"),
                           (f"cascade{n}, chosen on verdicts", "best fixed cascade chosen on the same verdicts",
                            "not_below_cascade_on_verdicts")]  # fmt: skip
                for row, what, key in against:
                    casc = result["rows"].get(f"{row}@{t:.0%}")
                    if casc is None or c.get(key) is None:
                        continue
                    lines.append(
                        f"| (d) noise {fa:g},{fr:g}, target {t:.0%}, up to {n} | never below the {what}, same "
                        f"verifier | {policy['resolved_rate']:.1%} at ${policy['cost_per_completed']:.4f} | "
                        f"{folds_chosen(casc['chosen_on_training'])}: {casc['resolved_rate']:.1%} at "
                        f"${casc['cost_per_completed']:.4f} | {policy['cost_per_completed'] / casc['cost_per_completed']:.2f}×, "
                        f"{100 * (policy['resolved_rate'] - casc['resolved_rate']):+.1f} pt | {'met' if c[key] else 'not met'} |"
                    )
                continue
            label = "(b)" if t >= 0.8 else "(c)"
            casc = result["rows"][f"{ref}@{t:.0%}"]
            lines.append(
                f"| {label} target {t:.0%}, up to {s['retries'] + 1} attempts | ≥ 3-attempt cascade −1 pt at ≤ "
                f"{c['bound']:.2f}× its $/completed | {policy['resolved_rate']:.1%} at ${policy['cost_per_completed']:.4f} | "
                f"{folds_chosen(casc['chosen_on_training'])}: {casc['resolved_rate']:.1%} at "
                f"${casc['cost_per_completed']:.4f} | {c['ratio']:.2f}× | {'met' if c['met'] else 'not met'} |"
            )
    return "\n".join(lines) + "\n"
