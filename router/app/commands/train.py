"""`router train` (`router promote` is ``router.rollout.promote``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from router.errors import ConfigError
from router.learning.labels import fromlog
from router.learning.training import caps as callcaps
from router.learning.training import dataset, keyshare, offpolicy, stoploss
from router.learning.training import scopes as scoped
from router.learning.training.estimates import MIN_ROWS, as_estimates, fit_estimates
from router.learning.training.fit import fit
from router.learning.training.outputs import fit_output_tokens
from router.learning.training.value import MARGINS
from router.policy import prior as priors
from router.policy.active import objective_for
from router.policy.artifact import Artifact
from router.policy.config import Policy
from router.policy.learned import LearnedScorer
from router.policy.loading import load_policy
from router.store import OutcomeRecord, RequestRecord
from router.store.window import opened
from router.telemetry import tables

#: Fewer labelled attempts than this on some model and ``router train`` refuses (``--force``
#: overrides): a success rate from a handful of tasks says more about the tasks than the model.
MIN_ATTEMPTS_PER_MODEL = 10


async def read_log(store_url: str, since: float = 0.0) -> tuple[list[RequestRecord], list[OutcomeRecord]]:
    async with opened(store_url) as store:  # a missing file is an error, never a new empty log
        return await store.requests_since(since), await store.outcomes_since(0.0)


def attempts_per_model(rows: list[dataset.AttemptRow]) -> dict[str, int]:
    """Labelled attempts per model, every model the logged decisions could choose included (at 0)."""
    counts = dict.fromkeys(sorted({m for r in rows for m in r.actions}), 0)
    for r in rows:
        counts[r.model] = counts.get(r.model, 0) + 1
    return counts


def catalog_mismatch(counts: dict[str, int], catalog: list[str], config: str) -> list[str]:
    """What a log made under another policy would otherwise hide: attempts on models this policy
    never routes to, and models of the policy the log says nothing about (each gets an even chance)."""
    foreign = [m for m in counts if m not in catalog]
    unseen = [m for m in catalog if not counts.get(m)]
    lines = []
    if foreign:
        lines.append(f"warning: not models of {config} (learned, but this policy never routes to them): "
                     + ", ".join(foreign))  # fmt: skip
    if unseen:
        lines.append(f"warning: models of {config} with no labelled attempt in the log (an even chance "
                     "until it has some): " + ", ".join(unseen))  # fmt: skip
    return lines


class TooFewLabels(ConfigError):
    """Not enough labelled attempts to train on (a usage error, reported in one line)."""


def _no_routing(
    rows: list[dataset.AttemptRow], counts: dict[str, int], min_attempts: int, force: bool, catalog: list[str],
    config: str, served_by: Sequence[str] = (),
) -> tuple[str, str] | None:  # fmt: skip
    """Why the log's labels cannot teach routing, and what to do (None: they can). ``served_by``:
    the names of the policies the log's requests were decided by."""
    label = "label tasks with `router outcome TASK_ID --success|--failure` or POST /v1/outcomes"
    if not rows:  # --force cannot fit on nothing
        return "no labelled attempts in the log to train on", label
    if not force and not any(counts.get(m) for m in catalog):
        # The artifact would know none of the models it is for, and `router promote` refuses it.
        return (f"the log's labelled attempts are all of models {config} does not have ({', '.join(counts)})",
                "train with --config the policy that served the log" + _named(served_by) + ", or pass --force")  # fmt: skip
    # The policy's own models only: one request once sent to a model since dropped from the file
    # ("local-deep 1") kept routing from being learned for models with hundreds of labels each.
    short = {m: n for m, n in counts.items() if n < min_attempts and m in catalog}
    if short and not force:
        return (f"too few labelled attempts to train on ({', '.join(f'{m} {n}' for m, n in short.items())};"
                f" need {min_attempts} per model)", f"{label}, let the policy explore, or pass --force")  # fmt: skip
    return None


def _named(policies: Sequence[str]) -> str:
    """Which file that is, by the name the log keeps (a file's ``name:``): after `router demo --tasks
    300`, `router train` on policies/default.yaml said only "the policy that served the log"."""
    if not policies:
        return ""
    names = " and ".join(repr(p) for p in policies)
    one = len(policies) == 1
    return f" (the log's requests were decided by the {'policy' if one else 'policies'} named {names} in {'its file' if one else 'their files'})"


def _sizes_only(
    requests: list[RequestRecord], catalog: list[str], config: str, out: str, console: Console,
    why: tuple[str, str], store_url: str,
) -> Trained:  # fmt: skip
    """An artifact of what needs no labels: each backend's sizes of a call (output mean and 90th
    percentile, turn and cache cells, provider/o200k ratio), which would otherwise stay at the
    priors (the flat output default) for as long as no one reports outcomes. It has no models: a
    router that pins it routes as without one, and prices and holds by these."""
    reason, hint = why
    estimates = as_estimates(fit_estimates(requests))
    if not set(estimates.learned) & set(catalog):
        raise TooFewLabels(f"{reason}: {hint}; nor has any backend of {config} the {MIN_ROWS} calls with "
                           "reported usage a call's size is learned from")  # fmt: skip
    stamps = [r.ts for r in requests]
    artifact = Artifact(models={}, estimates=estimates, report={
        "trained_at": time.time(), "routing": f"not learned: {reason}",
        "data": {"requests": len(requests), "from_ts": min(stamps), "to_ts": max(stamps)},
    })  # fmt: skip
    path, sha = _write(artifact, out)
    console.print(f"routing is not learned ({reason}): {hint}", highlight=False, soft_wrap=True)
    console.print("the artifact holds each backend's sizes of a call only: promoted, the policy routes as with no "
                  "artifact (its rules, then the cheapest expected cost), priced and held by them", highlight=False)  # fmt: skip
    _print_estimates(console, artifact)
    _print_wrote(console, path, sha)
    _print_next(console, path, config, store_url)
    return Trained(path, sha, artifact, {})


def _write(artifact: Artifact, out: str) -> tuple[Path, str]:
    raw = artifact.to_json()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all, so that what a Ctrl-C says of --out (written or not) holds.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)
    return path, hashlib.sha256(raw).hexdigest()


def scorer_for_evaluation(artifact: Artifact, policy: Policy) -> LearnedScorer:
    """The new artifact as the router would run it, without exploration."""
    return LearnedScorer(artifact, objective_for(policy, artifact))


@dataclasses.dataclass(frozen=True)
class Trained:
    """What `router train` wrote: the artifact (and where, and its sha256 to pin) and the label model's report."""

    path: Path
    sha256: str
    artifact: Artifact
    labels: dict[str, Any]


def run(args: argparse.Namespace) -> int:
    from router.app.settings import config_given
    from router.store.window import parse_duration

    since = time.time() - parse_duration(args.since) if args.since else 0.0
    train(args.store, config_given(args.config), args.out, since=since, min_attempts=args.min_attempts,
          force=args.force, min_scope_attempts=args.min_scope_attempts, max_key_share=args.max_key_share,
          trajectories=args.trajectories)  # fmt: skip
    return 0


@dataclasses.dataclass
class _Progress:
    """How far `router train` got, for what a Ctrl-C says: it said nothing (exit 130), so whether
    --out held the new artifact, an old one or half of one was anyone's guess."""

    out: str
    stage: str = "reading the log"
    wrote: tuple[Path, str] | None = None

    def interrupted(self) -> str:
        if self.wrote is None:
            return (f"router train: interrupted while {self.stage}: {self.out} was not written"
                    f"{' (the file there is the one from before)' if Path(self.out).exists() else ''}; "
                    "run the same command again to train")  # fmt: skip
        path, sha = self.wrote
        labels = path.with_name(path.stem + ".labels.json")
        return (f"router train: interrupted while {self.stage}: {path} is whole (sha256 {sha}), preview and "
                f"promote it as below; the label model ({labels}) was not refitted")  # fmt: skip


def train(
    store_url: str, config: str, out: str, since: float = 0.0, console: Console | None = None, *,
    min_attempts: int = MIN_ATTEMPTS_PER_MODEL, force: bool = False,
    min_scope_attempts: int = scoped.MIN_ATTEMPTS, max_key_share: float = keyshare.MAX_KEY_SHARE,
    trajectories: str | None = None,
) -> Trained:  # fmt: skip
    console = console or Console()
    _check_paths(out, trajectories)
    progress = _Progress(out)
    try:
        return _train(store_url, config, out, since, console, progress, min_attempts=min_attempts, force=force,
                      min_scope_attempts=min_scope_attempts, max_key_share=max_key_share,
                      trajectories=trajectories)  # fmt: skip
    except KeyboardInterrupt:
        print(progress.interrupted(), file=sys.stderr, flush=True)
        if progress.wrote is not None:
            _print_next(console, progress.wrote[0], config, store_url)
        raise  # the CLI exits 130, as a program stopped by SIGINT


def _train(
    store_url: str, config: str, out: str, since: float, console: Console, progress: _Progress, *,
    min_attempts: int, force: bool, min_scope_attempts: int, max_key_share: float, trajectories: str | None,
) -> Trained:  # fmt: skip
    policy = load_policy(config)
    requests, outcomes = asyncio.run(read_log(store_url, since))
    rows = dataset.build(requests, outcomes, abandon_after_s=policy.spec.tasks.abandon_after_s)
    dominant = keyshare.cap_keys(rows, max_key_share)
    for d in dominant:
        console.print(f"key {d.key} dominates the labels ({d.share:.1%} of the training weight): its "
                      f"attempts count ×{d.scale:.3f}", highlight=False)  # fmt: skip
    counts = attempts_per_model(rows)
    console.print(
        "labelled attempts per model: " + (", ".join(f"{m} {n}" for m, n in counts.items()) or "none")
    )
    catalog = [m.id for m in policy.spec.models]
    for line in catalog_mismatch(counts, catalog, config):
        console.print(line, highlight=False)
    # The log keeps "NAME/SCORER" per request; the labelled attempts' are what training would read.
    labelled = {r.task_id for r in rows}
    served_by = sorted({r.policy.partition("/")[0] for r in requests if r.policy and r.task_id in labelled})
    why = _no_routing(rows, counts, min_attempts, force, catalog, config, served_by)
    if why is not None:
        return _sizes_only(requests, catalog, config, out, console, why, store_url)
    progress.stage = "fitting the routing model"
    fitted = fit(rows, max_attempts=policy.spec.objective.max_attempts, target=policy.spec.objective.target,
                 scopes=policy.spec.scopes, min_scope_attempts=min_scope_attempts)  # fmt: skip
    dominant_keys = [{"key": d.key, "share": round(d.share, 6), "scale": round(d.scale, 6)} for d in dominant]
    # Per model: a cap on an attempt's calls, and a stop-loss where the log's attempts (or recorded
    # runs) show it pays.
    stops, source = _stop_losses(trajectories, list(counts), requests, rows)
    caps = callcaps.from_log(rows)
    said = {"stop_loss": {m: c.to_json() for m, c in stops.items()}, "stop_loss_from": source,
            "call_caps_not_learned": caps.not_learned}  # fmt: skip
    fitted = dataclasses.replace(
        fitted,
        output_tokens=fit_output_tokens(requests),
        controls=stoploss.merge(caps.controls, stops),
        # Per backend: provider tokens per o200k token, output mean and 90th percentile, cached share.
        estimates=as_estimates(fit_estimates(requests)),
        report={**fitted.report, "dominant_keys": dominant_keys, **said},
    )
    scorer = scorer_for_evaluation(fitted, policy)

    def choose(r: dataset.AttemptRow) -> str:
        plan, _ = scorer.plan(r.vector, r.actions, attempt=r.attempt, failed=r.failed_before)
        return plan.models[0]

    new = offpolicy.evaluate(rows, choose)
    old = offpolicy.logged(rows)
    ips = offpolicy.evaluate(rows, choose, snips=False)
    ope = {"logged": _est(old), "new_snips": _est(new), "new_ips": _est(ips)}
    artifact = dataclasses.replace(fitted, report={**fitted.report, "offpolicy": ope})
    path, sha = _write(artifact, out)
    progress.wrote, progress.stage = (path, sha), "fitting the label model"
    _print(console, artifact)
    # Said as soon as it is written: a Ctrl-C during the label model's fit leaves the artifact whole.
    _print_wrote(console, path, sha)
    console.print(prior_line(scorer), highlight=False)
    console.print(callcaps.line(caps), highlight=False)
    console.print(stoploss.line(stops, source), highlight=False)
    # The outcome label model: measured on the log's explicit outcomes, refitted when they suffice.
    labels = fromlog.train(outcomes, policy.label_model, path.with_name(path.stem + ".labels.json"))
    for line in fromlog.lines(labels):
        console.print(line, highlight=False)
    # Last: what to run next was in the middle, above the objective's, caps', stop-loss's and
    # label model's lines, off the top of a terminal by the time training ended.
    _print_next(console, path, config, store_url)
    return Trained(path, sha, artifact, labels)


def _check_paths(out: str, trajectories: str | None) -> None:
    """Said before the log is read and fitted, not after: `--out policies/learned/` failed with
    "Is a directory" once training had taken its 45 seconds."""
    if Path(out).is_dir():
        raise ConfigError(
            f"--out {out} is a directory: name the artifact's file, e.g. --out {Path(out) / 'v1.json'}"
        )
    if trajectories is not None and not Path(trajectories).exists():
        raise ConfigError(f"--trajectories {trajectories}: no such trajectory file or directory")


def _stop_losses(
    path: str | None, models: list[str], requests: list[RequestRecord], rows: list[dataset.AttemptRow]
) -> tuple[dict[str, stoploss.Choice], str]:
    """Each model's stop-loss, and where it was learned: from the runs in ``path`` of the log's
    models, else from the log's attempts with explicit outcomes and the reading logged at each call."""
    if path is None:
        return stoploss.learn(stoploss.runs_from_log(requests, rows)), "the log"
    from router.learning.evals import turns

    known = {k: r for k, r in turns.load([path]).items() if k[1] in models}
    return stoploss.learn(stoploss.runs_from(known)), f"--trajectories {path}"


def prior_line(scorer: LearnedScorer) -> str:
    """What the policy does for its objective: the prior plan, and whether tasks leave it."""
    o = scorer.objective
    if o.value is None:
        return ("prior plan: none without a value or a target (objective.value_per_completed_usd or "
                "target_success); each task is planned alone at its least cost per completed task")  # fmt: skip
    if o.prior is None:
        return "prior plan: none (the artifact has no prior plans for this retry limit); each task is planned alone"
    art = scorer.artifact
    plan = " → ".join(o.prior) or "stop (no order is worth its cost)"
    # A target's plan may come from a shorter frontier (orders of at most ``Point.longest`` models).
    fixed = next((p for f in art.frontiers.values() for p in f if p.models == o.prior), None)
    line = f"prior plan (the best fixed order on this log for the objective): {plan}"
    if o.default:
        line = (f"default single shot (no value or target): serves {plan}, the best single model on this log "
                "(the least cost per completed task)")  # fmt: skip
    if fixed is not None:
        line += f", completing {fixed.success:.1%} of the training tasks at ${fixed.cost:.4f} per task"
    target = o.target
    point = priors.nearest(
        art.points.get(o.max_attempts, ()), target=target, value=None if target else o.value
    )
    if target is not None and point is not None:
        longest = point.longest or o.max_attempts
        line += (f" (chosen at the target + {100 * point.above:g} pt among orders of up to {longest}, as an "
                 "inner cross-validation on the training tasks says it needs to reach the target on new ones)")  # fmt: skip
    tried = "/".join(f"{m:g}" for m in MARGINS if not math.isinf(m))
    if point is None or math.isinf(o.margin):
        return line + (f"; per-task deviations (margins {tried} × V tried on out-of-fold replays of the training "
                       f"tasks) gained nothing clear of noise: the policy is {'that model' if o.default else 'the prior plan'}")  # fmt: skip
    return line + (f"; a task leaves it when its own plan is worth {o.margin:g} × V more (chosen on out-of-fold "
                   f"replays of the training tasks): it did on {point.deviations:.1%} of attempts there, "
                   f"gaining ${point.gain:.5f} per task")  # fmt: skip


def _est(e: offpolicy.OffPolicyEstimate) -> dict[str, Any]:
    def r(x: float) -> float | None:
        return None if math.isnan(x) or math.isinf(x) else round(x, 6)

    return {
        "success": r(e.success), "cost_per_attempt": r(e.cost_per_attempt),
        "cost_per_completed": r(e.cost_per_completed),
        "ci_success": [r(x) for x in e.ci_success],
        "ci_cost_per_completed": [r(x) for x in e.ci_cost_per_completed], "matched": e.matched,
    }  # fmt: skip


def _print(console: Console, a: Artifact) -> None:
    d, m = a.report["data"], a.report["metrics"]
    console.print(f"[bold]data[/]: {d['attempts']} attempts of {d['tasks']} tasks, "
                  f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(d['from_ts']))} → "
                  f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(d['to_ts']))}; labels {d['labels']}")  # fmt: skip
    console.print(f"[bold]calibration[/]: Brier {m['brier']} (base rate alone: {m['brier_base_rate']}), "
                  f"AUC {m.get('auc')}")  # fmt: skip
    pw = m.get("pairwise") or {}
    if pw:
        console.print(
            "[bold]pairwise[/] (tasks where exactly one of two models succeeded; does the higher "
            f"probability point to it?): all pairs {_share(pw['all'])}, close pairs (success rates "
            f"within 5 points) {_share(pw['close'])}"
        )
    rel = Table("bin", "n", "predicted", "observed", title="reliability (out-of-fold)")
    for b in m["reliability"]:
        rel.add_row(b["bin"], str(b["n"]), f"{b['predicted']:.2f}", f"{b['observed']:.2f}")
    tables.show(console, rel)
    models = Table("model", "attempts", "success", "mean $/attempt", title="per model")
    for mid, p in a.models.items():
        models.add_row(mid, str(p.n), _fmt(p.success_rate, "{:.0%}"), _fmt(p.mean_cost, "{:.5f}"))
    tables.show(console, models)
    t = Table("policy", "success", "95% CI", "$ per completed task", "95% CI", "attempts used",
              title="off-policy estimate")  # fmt: skip
    o = a.report["offpolicy"]
    for name, e in (("logged (produced the log)", o["logged"]), ("new, SNIPS", o["new_snips"]),
                    ("new, IPS", o["new_ips"])):  # fmt: skip
        t.add_row(name, _fmt(e["success"], "{:.1%}"), _ci(e["ci_success"], "{:.1%}"),
                  _fmt(e["cost_per_completed"], "${:.5f}"), _ci(e["ci_cost_per_completed"], "${:.5f}"),
                  str(e["matched"]))  # fmt: skip
    tables.show(console, t)
    for r in a.report.get("scope_report") or []:
        console.print(_scope_line(r), highlight=False, soft_wrap=True)  # one line each, for grep
    _print_estimates(console, a)


def _print_estimates(console: Console, a: Artifact) -> None:
    est = Table("backend", "calls", "provider/o200k", "mean output", "turn cells", "p90 output", "cached share",
                title="estimates (n/a: too few calls, the prior stays)")  # fmt: skip
    for mid, e in a.estimates.learned.items():
        est.add_row(mid, _fmt(e.n, "{}"), _fmt(e.tokens_ratio, "{:.3f}"), _fmt(e.output_mean, "{:.0f}"),
                    str(len(e.output_cells or ())), _fmt(e.output_p90, "{:.0f}"),
                    _fmt(e.cache_share, "{:.1%}"))  # fmt: skip
    tables.show(console, est)


def _print_wrote(console: Console, path: Path, sha: str) -> None:
    # The hash on a line of its own: after the path, an 80-column terminal broke it in two.
    console.print(f"wrote {path}\n  sha256 {sha}", highlight=False)


def _print_next(console: Console, path: Path, config: str, store_url: str) -> None:
    # The preview first: it only said to promote, straight into the policy routers serve, an
    # artifact whose preview said success falls. Each command on a line of its own, never
    # wrapped: broken in two it no longer pastes as one.
    if config.endswith(".candidate.yaml"):
        # Trained for the copy, its objective edited: it said to copy it to X.candidate.candidate.yaml,
        # then to promote into the live file, whose objective (none, 3 attempts) ran the demo's
        # artifact at -0.071 per attempt where the previewed one (0.6, 1 attempt) showed +0.269.
        said, candidate, copy = "put the previewed file in place", config, []
        live = config.removesuffix(".candidate.yaml") + ".yaml"
        live = (
            live if Path(live).exists() else "THE_POLICY_YOUR_ROUTERS_SERVE.yaml"
        )  # no guess into a wrong file
        last = f"cp {candidate} {live}   # what the preview showed: its objective and this artifact"
    else:
        said, candidate = "promote it", str(Path(config).with_suffix(".candidate.yaml"))
        copy, last = [f"cp {config} {candidate}"], f"router promote {path} --config {config}"
    console.print(f"preview it on a copy of the policy, then {said}:", highlight=False)
    # The preview reads the log it is told to: the default one, while training read --store's.
    where = (
        "" if store_url == os.environ.get("ROUTER_STORE", "sqlite:///router.db") else f" --store {store_url}"
    )
    for command in (*copy, f"router promote {path} --config {candidate}",
                    f"router preview --config {candidate} --since 7d{where}", last):  # fmt: skip
        console.print(f"  {command}", highlight=False, soft_wrap=True)


def _scope_line(r: dict[str, Any]) -> str:
    return scoped.ScopeResult(r["scope"], r["tasks"], r["attempts"], r["kept"], r["reason"],
                              r["log_loss_global"], r["log_loss_scoped"]).line()  # fmt: skip


def _share(p: dict[str, Any]) -> str:
    return "n/a" if p.get("accuracy") is None else f"{p['accuracy']:.1%} of {p['n']}"


def _fmt(x: float | None, f: str) -> str:
    return "n/a" if x is None else f.format(x)


def _ci(ci: list[float | None], f: str) -> str:
    return "n/a" if None in ci else f"{f.format(ci[0])}-{f.format(ci[1])}"
