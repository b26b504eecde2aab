"""Preview a policy edit against the log: every logged decision made again under the new policy.

What a request looked like is rebuilt from what the log kept: the requested model, the prompt's
size, the client's output limit, tools, thinking, streaming, side call, attempt, the headers the
running policy's rules read, and the task's hashed feature vector (logged on the task's first
request). Tasks are replayed in order, so
within an attempt a task stays pinned where the *new* policy started it, and a model's prefix
is warm only where the replay's previous request of the task went (within that model's cache
lifetime). Not in the log, so not replayed: headers no rule of the logging policy read, image
inputs, the loop and tool-failure signals that leave a pinned model, budgets.

Cost after is each request's logged tokens at the new route's prices: the same cache reads
where the model does not change, and where a move leaves the warm model, the whole prompt
fresh (written to the cache where the provider charges for that); ``cache_switch_usd`` is what
caching changes after the moves: the projection against the logged cache reads, both in the new
backend's tokens (negative where the replay finds more of a prompt warm than the log had cached). Hosted tools' fees (web searches, ...) are carried as logged. Success after is projected two ways when the data allow: by the learned model's
P(success) of the new and the logged model per attempt (a bootstrap interval over attempts:
the sampling error of the traffic, not the model's own error), and off-policy (SNIPS over
logged attempts with outcomes, by their propensities; ``router.learning.training.offpolicy``).
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from router.errors import RouterError
from router.features.request import Features
from router.features.task.vector import from_json, with_attempt
from router.forward.accounting import cost_split
from router.learning.training import dataset, offpolicy
from router.policy.active import ActivePolicy, build_active_policy
from router.policy.catalog import Backend
from router.policy.config import ObjectiveSpec
from router.policy.decide import Decider
from router.policy.estimates import turn_of_cell
from router.policy.learned import LearnedScorer
from router.policy.pricing import estimate
from router.policy.scopes import logged_facts
from router.policy.window import over_window
from router.protocols.common import Usage
from router.store import OutcomeRecord, RequestRecord, Store
from router.store.window import latest_requests

RISK_EXAMPLES = 5
#: A logged prompt (the log's largest column by far) is not replayed: not read.
UNREAD = frozenset({"prompt"})


def features_of(r: RequestRecord, vector: Mapping[int, float] | None, after: str | None = None) -> Features:
    """The decision's inputs as the log kept them (the turn's sizes as its logged output cell).
    ``after``: the backend whose count of the task's previous request the logged estimate starts
    from; None for a task's first request, whose estimate is o200k tokens, no backend's count."""
    turn_chars, turn_verb = turn_of_cell(next((e.output_cell for e in r.candidates or ()), None))
    prompt, anchor = r.prompt_tokens_est, after
    if prompt is None:  # only the served backend's count was kept
        prompt, anchor = r.input_tokens or 0, r.chosen_model
    return Features(
        protocol=r.protocol or "",
        requested_model=r.requested_model or "",
        prompt_tokens=prompt,
        max_output_tokens=r.max_tokens,
        tools=bool(r.n_tools),
        n_tools=r.n_tools or 0,
        thinking=r.thinking_budget is not None or r.reasoning_effort not in (None, "none"),
        vision=False,
        stream=r.stream,
        n_messages=r.n_messages or 0,
        side_call=r.side_call,
        headers=r.rule_headers or {},
        task_vector=vector,  # as the tracker hands it over: the scorer adds the attempt
        attempt=r.attempt or 1,
        # As serving had it: taken as the served backend's count, a first request's o200k estimate
        # was converted to a cheaper backend's smaller count, which a window it had not fit took.
        prompt_anchor=prompt if anchor is not None else 0,
        anchor_model=anchor,
        turn_chars=turn_chars,
        turn_verb=turn_verb,
    )


def first_choice(r: RequestRecord) -> str:
    """The model the logged decision put first (what served may be a fallback)."""
    return r.tries[0].model if r.tries and r.tries[0].model else str(r.chosen_model)


def logged_usage(r: RequestRecord) -> Usage:
    return Usage(
        input_tokens=r.input_tokens or r.prompt_tokens_est or 0,
        output_tokens=r.output_tokens or 0,
        cache_read_tokens=r.cache_read_tokens,
        cache_write_tokens=r.cache_write_tokens,
    )


def in_tokens_of(usage: Usage, prompt_tokens: int) -> Usage:
    """``usage`` with its prompt (and its cache reads and writes, in proportion) counted as
    ``prompt_tokens``: another backend's count of the same prompt."""
    scale = prompt_tokens / usage.input_tokens if usage.input_tokens else 1.0
    return replace(
        usage,
        input_tokens=prompt_tokens,
        cache_read_tokens=round((usage.cache_read_tokens or 0) * scale),
        cache_write_tokens=round((usage.cache_write_tokens or 0) * scale),
    )


def risks_of(backend: Backend, f: Features, r: RequestRecord) -> list[str]:
    """What of the logged request the model would not take."""
    out = []
    # Where the model stops at its window, the logged reply is what must fit (a longer limit is cut).
    if over_window(backend, f.max_output_tokens or r.output_tokens, r.output_tokens or 0, f.prompt_tokens):
        out.append("context_window")
    if f.tools and not backend.tools:
        out.append("tools")
    if f.thinking and not backend.thinking:
        out.append("thinking")
    if (r.output_tokens or 0) > backend.max_output_tokens:
        out.append("max_output_tokens")
    return out


@dataclass
class _TaskReplay:
    vector: Mapping[int, float] | None = None
    #: The repository the log kept for the task (scopes may match on it).
    repo: str | None = None
    #: attempt → the model the new policy started it on
    pinned: dict[int, str] = field(default_factory=dict)
    #: model, tokens, until, what the model reported cached (None: it was not the logged model's call)
    warm: tuple[str, int, float, int | None] | None = None
    #: side call or not → the backend that reported the count of the latest such logged request
    counted: dict[bool, str] = field(default_factory=dict)


@dataclass
class _Tally:
    requests: int = 0
    skipped: int = 0
    tasks: set[str] = field(default_factory=set)
    #: (task, attempt) of every request decided again: a task of side calls alone has its attempt
    #: too, though no main-loop request opened one in ``attempts``
    decided: set[tuple[str, int]] = field(default_factory=set)
    moves: Counter[str] = field(default_factory=Counter)
    unroutable: Counter[str] = field(default_factory=Counter)
    risks: Counter[str] = field(default_factory=Counter)
    risk_examples: list[dict[str, Any]] = field(default_factory=list)
    cost_before: float = 0.0
    cost_after: float = 0.0
    cache_switch: float = 0.0
    #: (task, attempt) → (logged model, new model): the first main-loop request of each attempt
    attempts: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)


def _mean_ci(values: Sequence[float], rng: random.Random, resamples: int) -> dict[str, Any]:
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    return {"mean": round(sum(values) / n, 4),
            "ci95": [round(means[int(0.025 * (resamples - 1))], 4), round(means[int(0.975 * (resamples - 1))], 4)]}  # fmt: skip


def _learned_success(
    scorer: LearnedScorer, tally: _Tally, vectors: Mapping[str, Mapping[int, float] | None], resamples: int
) -> dict[str, Any] | None:
    before, after, diff = [], [], []
    for (task, attempt), (old, new) in tally.attempts.items():
        vec = vectors.get(task)
        if vec is None:
            continue
        p = {o.model: o.p_success for o in scorer.options(with_attempt(vec, attempt), [old, new])}
        before.append(p[old])
        after.append(p[new])
        diff.append(p[new] - p[old])
    if not before:
        return None
    rng = random.Random(0)
    return {
        "method": f"learned model {scorer.name}: mean P(success) per attempt, logged vs new model; "
        "95% bootstrap interval over attempts",
        "attempts": len(before),
        "before": _mean_ci(before, rng, resamples),
        "after": _mean_ci(after, rng, resamples),
        "difference": _mean_ci(diff, rng, resamples),
    }


def _offpolicy_success(
    requests: Sequence[RequestRecord],
    outcomes: Sequence[OutcomeRecord],
    tally: _Tally,
    abandon_after_s: float,
) -> dict[str, Any] | None:
    rows = dataset.build(requests, outcomes, abandon_after_s=abandon_after_s)
    rows = [r for r in rows if (r.task_id, r.attempt) in tally.attempts]
    if not rows:
        return None

    def choose(r: dataset.AttemptRow) -> str:
        return tally.attempts[(r.task_id, r.attempt)][1]

    def est(e: offpolicy.OffPolicyEstimate) -> dict[str, Any]:
        ok = e.success == e.success  # not NaN
        return {"success": round(e.success, 4) if ok else None,
                "ci95": [round(x, 4) for x in e.ci_success] if e.ci_success[0] == e.ci_success[0] else None}  # fmt: skip

    new = offpolicy.evaluate(rows, choose)
    return {
        "method": "off-policy SNIPS over logged attempts with an outcome (explicit first, then labels), "
        "weighted by 1/propensity; 95% bootstrap interval",
        "attempts": len(rows),
        "matched": new.matched,
        "before": est(offpolicy.logged(rows)),
        "after": est(new) if new.matched else None,
    }


def preview(
    requests: Sequence[RequestRecord],
    outcomes: Sequence[OutcomeRecord],
    runtime: ActivePolicy,
    *,
    resamples: int = 200,
) -> dict[str, Any]:
    """The report (``--json`` prints exactly this). ``requests`` oldest first."""
    policy, catalog = runtime.policy, runtime.catalog
    # The deterministic choice: exploration would make a preview a lottery.
    deciders = [runtime.decider, *(s.decider for s in runtime.scopes)]
    calm = {id(d): Decider(d.policy, catalog, d.scorer) for d in deciders}
    for d in calm.values():
        d.epsilon = 0.0
    tally = _Tally()
    tasks: dict[str, _TaskReplay] = defaultdict(_TaskReplay)
    for r in requests:
        task_id, logged = r.task_id, r.chosen_model
        if not r.decision_id or not logged or not task_id:
            tally.skipped += 1  # refused before a decision: nothing to decide again
            continue
        t = tasks[task_id]
        if t.vector is None and r.task_features:
            t.vector = from_json(r.task_features)
        t.repo = t.repo or r.repo
        tally.requests += 1
        tally.tasks.add(task_id)
        tally.decided.add((task_id, r.attempt or 1))
        tally.cost_before += r.cost_usd or 0.0
        side = bool(r.side_call)
        f = features_of(r, t.vector, t.counted.get(side))
        if r.status == 200 and not r.usage_estimated:
            t.counted[side] = logged
        if not side:
            warm = t.warm if t.warm is not None and t.warm[2] >= r.ts else None
            f = replace(
                f,
                pinned=t.pinned.get(f.attempt),
                # A task starts a new attempt when the last one failed: its models count as failed.
                failed_models=tuple(dict.fromkeys(m for a, m in sorted(t.pinned.items()) if a < f.attempt)),
                warm_model=warm[0] if warm else None,
                warm_tokens=warm[1] if warm else 0,
                warm_cached=warm[3] if warm else None,
            )
        chosen_by = runtime.arm_for(task_id, logged_facts(r, t.repo))[1]
        try:
            new = calm.get(id(chosen_by), chosen_by).decide(f).chosen
        except RouterError as err:
            tally.unroutable[type(err).__name__] += 1
            continue
        old = first_choice(r)
        if new != old:
            tally.moves[f"{old} -> {new}"] += 1
        backend = catalog[new]
        usage = logged_usage(r)
        same_cost = cost_split(backend.price, usage).total
        held = usage.input_tokens or 0  # what the call leaves warm, in the tokens of the backend that took it
        if new == logged:
            cost = same_cost
        else:
            for kind in risks_of(backend, f, r):
                tally.risks[kind] += 1
                if len(tally.risk_examples) < RISK_EXAMPLES:
                    tally.risk_examples.append(
                        {"request_id": r.request_id, "move": f"{old} -> {new}", "risk": kind}
                    )
            # The served backend's count, in the new backend's tokens.
            reported = usage.input_tokens or 0
            sized = replace(
                f, prompt_tokens=reported, prompt_anchor=reported, anchor_model=logged, max_output_tokens=None
            )
            decider = runtime.decider
            held = decider.prompt_tokens(backend, reported, sized)
            cost = estimate(backend, sized, usage.output_tokens or 0, decider.estimates, held).cost_usd
            # Against the logged cache reads in the new backend's tokens: only caching is left in
            # the difference, not how the backends count (more cached than logged is negative).
            tally.cache_switch += cost - cost_split(backend.price, in_tokens_of(usage, held)).total
        # The log keeps what hosted tools cost, not which ran, so their fees are carried as billed.
        tally.cost_after += cost + (r.cost_tools_usd or 0.0)
        if not side:
            if f.attempt not in t.pinned:
                t.pinned[f.attempt] = new
                tally.attempts[(task_id, f.attempt)] = (logged, new)
            t.warm = (
                new,
                held,
                r.ts + backend.cache_ttl_s,
                usage.cache_read_tokens if new == logged else None,
            )
    scorer = runtime.decider.scorer
    learned = (
        _learned_success(scorer, tally, {k: v.vector for k, v in tasks.items()}, resamples)
        if isinstance(scorer, LearnedScorer)
        else None
    )
    success = {
        "learned_model": learned,
        "offpolicy": _offpolicy_success(requests, outcomes, tally, policy.spec.tasks.abandon_after_s),
    }
    # Said, not left to "no data": a policy without learned routing has no model to ask at all.
    why = {
        "learned_model": "no logged attempt with its task's features in the window"
        if isinstance(scorer, LearnedScorer)
        else f"the policy routes by {scorer.name.partition(':')[0]}, with no learned model of success",
        "offpolicy": "no logged attempt with an outcome in the window",
    }
    return {
        "policy": {
            "name": policy.name,
            "revision": runtime.revision,
            "source": policy.source,
            "scorer": scorer.name,
        },
        "requests": tally.requests,
        "tasks": len(tally.tasks),
        "attempts": len(tally.decided),
        "skipped": tally.skipped,
        "moved": sum(tally.moves.values()),
        "moves": dict(tally.moves.most_common()),
        "unroutable": dict(tally.unroutable),
        "cost_usd_before": round(tally.cost_before, 6),
        "cost_usd_after": round(tally.cost_after, 6),
        # A difference of sums: "+ 0.0" turns a rounded float residue of -0.0 into 0.0 ("$-0.000000").
        "cache_switch_usd": round(tally.cache_switch, 6) + 0.0,
        "success": success,
        "success_missing": {name: why[name] for name, s in success.items() if s is None},
        "warnings": _warnings(success, policy.spec.objective),
        "risks": {"counts": dict(tally.risks), "examples": tally.risk_examples},
        "not_replayed": [
            "headers that no rule of the logging policy read",
            "repositories named only in the system prompt (for scopes)",
            "image inputs",
            "loop and tool-failure signals that leave a pinned model",
            "budgets",
        ],
    }


def _warnings(success: Mapping[str, Any], objective: ObjectiveSpec) -> list[str]:
    """What a reader must not miss before promoting: success that falls for sure. On a demo log of
    60 tasks, a policy learned with ``--force`` moved every request to the cheapest model, the
    learned model expecting -0.096 [-0.147, -0.050] per attempt, and the preview said only
    "risks: none" (its risks are about fit). It ends with what to do about it: it said no more, and
    the demo's learned policy, made for the least cost per completed task, always warns."""
    learned = success.get("learned_model")
    diff = learned.get("difference") if learned else None
    if not diff or not diff.get("ci95") or diff["ci95"][1] >= 0:
        return []
    lo, hi = diff["ci95"]
    return [
        f"success falls: the learned model expects {diff['mean']:+.3f} per attempt [{lo:+.3f}, {hi:+.3f}] "
        f"under the new policy, the whole 95% interval below 0. {_what_next(objective)}"
    ]


def _what_next(o: ObjectiveSpec) -> str:
    """Why the objective asked for that, and the lever that holds success. Said first, "raise
    objective.target_success" was no lever: at 0.5 and at 0.7 over 3 attempts the demo's policy still
    fell per attempt (a cascade from local-nano, 85.5% of training tasks with its retries), while
    0.7 with max_attempts 1 moved it to local-large, 0.351 -> 0.784."""
    keep = "or keep the running policy (promote nothing)"
    if o.target_success is None and o.value_per_completed_usd is None:
        return ("Its objective, the least cost per completed task (no objective.target_success or "
                "value_per_completed_usd), trades that success for cost: to hold it, set objective.target_success "
                f"with objective.max_attempts: 1 and train again, {keep}")  # fmt: skip
    field, value = (
        ("target_success", f"{o.target_success:g}") if o.target_success is not None
        else ("value_per_completed_usd", f"${o.value_per_completed_usd:g}")
    )  # fmt: skip
    if o.max_attempts == 1:
        return f"Its objective asks for that (objective.{field} {value}): to hold success, raise it and train again, {keep}"
    return (f"Success is per attempt: for objective.{field} {value} over up to {o.max_attempts} attempts the "
            "plan starts tasks on cheaper models and tries a failed one again on another, which this preview "
            "does not replay and which happens only where failures are reported (router outcome --failure, "
            "POST /v1/outcomes) and the agent runs the task again. To hold success on the first attempt, set "
            f"objective.max_attempts: 1 and train again, {keep}")  # fmt: skip


async def preview_posted(
    store: Store, text: bytes, config: Path, seconds: float, max_requests: int
) -> dict[str, Any]:
    """``POST /v1/policy/preview``: ``text`` is a policy YAML placed beside the running one (its
    artifact path is relative to that directory); the window is the last ``seconds``, of which
    the latest ``max_requests`` requests are read (``window.capped`` says when older were left out)."""
    import asyncio

    runtime = await asyncio.to_thread(
        build_active_policy, text, config, f"{config.name} (posted)", posted=True
    )
    until = time.time()
    requests, capped = await latest_requests(store, until - seconds, max_requests, UNREAD)
    outcomes = await store.outcomes_since(until - seconds)
    report = await asyncio.to_thread(preview, requests, outcomes, runtime)
    since = requests[0].ts if capped else until - seconds
    report["window"] = {"since": since, "until": until, "capped": max_requests if capped else None}
    return report
