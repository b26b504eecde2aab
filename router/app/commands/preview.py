"""``router preview``: the policy file's decisions on the log's recent requests, printed or as JSON
(``router.rollout.preview`` computes it; the dashboard and ``POST /v1/policy/preview`` show the same)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def render(p: Mapping[str, Any], retrain: list[str] | None = None) -> None:
    """``retrain``: the commands that train the policy file again, said under a warning."""
    from rich.console import Console
    from rich.table import Table

    from router.telemetry import tables

    console = Console(soft_wrap=True)
    pol = p["policy"]
    console.print(f"[bold]preview of {pol['source']}[/] (revision {pol['revision']}, {pol['scorer']}): "
                  f"{p['requests']} requests of {p['tasks']} tasks ({p['attempts']} attempts) decided again; "
                  f"{p['skipped']} refused before any decision left out")  # fmt: skip
    moved = p["moved"]
    share = f" ({moved / p['requests']:.1%})" if p["requests"] else ""
    console.print(f"[bold]moved[/]: {moved} requests{share}")
    if p["moves"]:
        t = Table("from -> to", "requests", title_justify="left")
        for move, n in p["moves"].items():
            t.add_row(move, str(n))
        tables.show(console, t)
    if p["unroutable"]:
        console.print(f"[red]unroutable under the new policy[/]: {p['unroutable']}")
    before, after = p["cost_usd_before"], p["cost_usd_after"]
    change = f" ({(after - before) / before:+.1%})" if before else ""
    # Where the moves change no cache read, "$+0.000000" from caching was noise beside the figures.
    switch = round(p["cache_switch_usd"], 6)
    caching = (f"; of which {'-' if switch < 0 else '+'}${abs(switch):.6f} from prompt caching after the moves"
               if switch else "")  # fmt: skip
    console.print(f"[bold]cost[/]: ${before:.6f} logged → ${after:.6f} projected{change}{caching}")
    for name, s in p["success"].items():
        if s is None:
            console.print(f"[bold]success ({name})[/]: n/a ({p['success_missing'][name]})")
            continue
        # The after of an off-policy estimate rests on the matched attempts alone: often few.
        matched = (
            f", {s['matched']} of them on the model the new policy would choose" if "matched" in s else ""
        )
        console.print(f"[bold]success ({name})[/]: {s['method']}; {s['attempts']} attempts{matched}")
        for side in ("before", "after", "difference"):
            v = s.get(side)
            if v is None:
                if side in s:
                    console.print(f"  {side}: n/a (no logged attempt chose what the new policy would)")
                continue
            point = v.get("mean", v.get("success"))
            ci = v.get("ci95")
            ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
            console.print(f"  {side}: {'n/a' if point is None else f'{point:.3f}'}{ci_text}")
    for warning in p.get("warnings", ()):
        console.print(f"[yellow]warning[/]: {warning}")
    if p.get("warnings") and retrain:
        console.print("to train it again once its objective is edited:", highlight=False)
        for command in retrain:  # each whole on its line, to paste
            console.print(f"  {command}", highlight=False)
    risks = p["risks"]
    if risks["counts"]:
        console.print(
            f"[yellow]risks[/] (moves to a model the logged request would not fit): {risks['counts']}"
        )
        for ex in risks["examples"]:
            console.print(f"  {ex['request_id']}: {ex['move']} ({ex['risk']})")
    else:
        console.print("risks: none (no move goes to a model the logged request would not fit)")
    console.print(f"not in the log, so not replayed: {'; '.join(p['not_replayed'])}")


def run_preview(args: Any) -> int:
    import asyncio

    import orjson

    from router.policy.active import load_active_policy
    from router.rollout.preview import preview
    from router.store.window import parse_duration, read_window

    runtime = load_active_policy(args.config)
    window = asyncio.run(read_window(args.store, parse_duration(args.since)))
    report = preview(window.requests, window.outcomes, runtime)
    report["window"] = {"since": window.since, "until": window.until}
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        render(report, _retrain(args, runtime.policy.learned_path))
        if not report["requests"] and not report["skipped"]:
            # It printed "0 requests of 0 tasks" and a page of n/a, as if the policy had been
            # compared with something.
            from router.store import mask_url

            print(f"nothing was decided again: {mask_url(args.store)} has no request in the last {args.since}; "
                  "try a longer --since, or --store the log your routers write (their ROUTER_STORE)")  # fmt: skip
    return 0


def _retrain(args: Any, artifact: Path | None) -> list[str]:
    """`router train` for the previewed file, then the promote into it and this preview again."""
    import os

    out = artifact.with_name(f"{artifact.stem}.next.json") if artifact else Path("policies/learned/next.json")
    if out.is_relative_to(Path.cwd()):  # as the other paths are typed: the resolved one runs off the line
        out = out.relative_to(Path.cwd())
    # The log this preview read, which train reads too only when it is ROUTER_STORE's.
    store = (
        ""
        if args.store == os.environ.get("ROUTER_STORE", "sqlite:///router.db")
        else f" --store {args.store}"
    )
    return [
        f"router train --config {args.config} --out {out}{store}",
        f"router promote {out} --config {args.config}",
        f"router preview --config {args.config} --since {args.since}{store}",
    ]
