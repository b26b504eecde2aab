"""`router eval-sizes`: the router's prompt, output and cost estimates against what the provider reported.

Each trajectory (``router.learning.labels.replay``: one request before each assistant turn, the
provider's ``usage`` on that turn) is replayed through what the proxy does with a request: the
protocol parser, ``PromptSizer.measure`` (memo, anchor, estimate), the decision (``Decider``: its
per-call estimate of output and cost, the context-window constraint, ``size_matters`` and the
exact count it asks for), then ``PromptSizer.reported`` with the provider's count, as
``Pipeline.finish`` does. The warm prefix is the previous call's reported prompt on the same
backend, as ``TaskContext.served`` records it.

The fit columns ask, per window W in ``WINDOWS``: would a backend of that window be kept by the
decision on the router's size (an exact count when the bounds straddle the window), and would it
be kept on the provider's count? A *false fit* is kept but too small (the call fails or is cut);
a *false exclude* is dropped but would have fitted.

Baselines in the same run, on the same requests: ``chars4`` (all characters / 4), ``o200k`` (an
exact o200k count of the whole prompt) and ``prev_chars4`` (the previous call's reported count +
the new messages' characters / 4; the first call: chars / 4).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from router.errors import ContextTooLarge
from router.features.memo import ConversationMemo
from router.features.promptsize import COUNT_NEW_CHARS, PromptSizer
from router.features.request import Features, turn_shape
from router.features.tokens import TokenCounter, item_text
from router.learning.labels.replay import Trajectory, requests
from router.learning.training.estimates import MIN_ROWS, as_estimates, fit_estimates
from router.policy.catalog import build_catalog
from router.policy.decide import Decider
from router.policy.estimates import cell_mean, parent_cell, turn_cell
from router.policy.loading import parse_policy
from router.policy.pipeline import request_features
from router.protocols import WIRES
from router.protocols.common import OPENAI_CHAT
from router.store import RequestRecord
from router.store.records import Estimate

WINDOWS: Final = (16_384, 32_768, 65_536, 131_072)
BASELINES: Final = ("chars4", "o200k", "prev_chars4")
#: The replayed backend: Gemini 3 Pro's prices (USD per million), as the trajectories' provider billed them.
BACKEND: Final = "gemini"
_MEMO_BYTES: Final = 256 << 20


def _policy_text() -> str:
    price = "prices: {input: 2.0, output: 12.0, cache_read: 0.2}, max_output_tokens: 65536"
    models = [f"  - {{id: {BACKEND}, litellm_model: gemini/gemini-3-pro-preview, protocol: openai, "
              f"{price}, context_window: 1048576}}"]  # fmt: skip
    routes = [f"  - {{match: replay, candidates: [{BACKEND}]}}"]
    for w in WINDOWS:
        models.append(
            f"  - {{id: w{w}, litellm_model: gemini/w{w}, protocol: openai, {price}, context_window: {w}}}"
        )
        routes.append(f"  - {{match: w{w}, candidates: [w{w}]}}")
    return "models:\n" + "\n".join(models) + "\nroutes:\n" + "\n".join(routes) + "\n"


@dataclass(slots=True)
class Row:
    """One replayed request: the router's estimates, the baselines and what the provider reported."""

    task: str
    turn: int
    anchored: bool
    prompt: int  # provider's count
    prompt_est: int  # the router's, in the provider's tokens (the decision's estimate for the backend)
    #: The size the log keeps (``prompt_tokens_est``): the anchor in its provider's tokens, the rest o200k.
    logged: int
    output: int
    output_est: int
    cost: float | None  # None: the provider reported no cost for the call
    cost_est: float
    cached: int
    cached_est: int
    #: The warm prefix (the previous call's reported prompt), its whole cache blocks, the call's
    #: output cell (``turn_cell`` of the request, whether or not the decision was told it) and its
    #: cache cell (``cache_cell``).
    warm: int
    cacheable: int
    cell: str | None
    cache_cell: str | None
    micros: float
    turn_micros: float  # the turn's cell (``turn_shape`` and ``turn_cell``), not in ``micros``
    #: Per window: (router keeps it, the provider's count keeps it).
    fits: dict[int, tuple[bool, bool]]
    baselines: dict[str, int]
    baseline_fits: dict[str, dict[int, bool]]


class Replayer:
    """The router's sizing, decision and cost code over trajectories, one conversation after another.

    The features come from ``request_features``, as the pipeline builds them: what the pipeline
    does not pass the decision (``turn_chars`` until it does) the replay does not either."""

    def __init__(self, learned: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """``learned``: ``fit_estimates``' output for the replayed backend (None: the priors)."""
        policy = parse_policy(_policy_text(), source="eval-sizes", env={})
        catalog = build_catalog(policy, lookup=lambda m: None)
        fitted = (learned or {}).get(BACKEND)
        # Every window's backend is the replayed one with another window: it learned the same.
        estimates = as_estimates({b: fitted for b in catalog.backends} if fitted else {})
        self.decider = Decider(policy, catalog, estimates=estimates)
        self.backend = catalog[BACKEND]
        self.ratio = estimates.tokens_ratio(BACKEND, self.backend.provider)
        self.sizer = PromptSizer(
            TokenCounter(), ConversationMemo(_MEMO_BYTES), count_new_chars=COUNT_NEW_CHARS
        )
        # Loaded before the first request is timed, as the router loads it at start.
        assert self.sizer.counter.encoding is not None
        # The baselines' exact counts and the exact counts of what the router left pending: a
        # counter of their own, so the router's cache knows only what the router counted.
        self.exact = TokenCounter()
        self.wire = WIRES[OPENAI_CHAT]

    def replay(self, t: Trajectory) -> list[Row]:
        usages = [
            m.get("usage") or {} for k, m in enumerate(t.messages) if k >= 2 and m.get("role") == "assistant"
        ]
        rows: list[Row] = []
        warm, warm_cached = 0, None
        prev: tuple[int, int] | None = None  # (messages, reported prompt) of the previous call
        for turn, (raw, usage) in enumerate(zip(requests(t, "text"), usages, strict=True), 1):
            req = self.wire.parse(raw)
            started = time.perf_counter()
            size = self.sizer.measure(req, t.instance_id, len(raw))
            if self.sizer.wants_count(size):  # as Pipeline.decide does
                self.sizer.settle(size)
            micros = (time.perf_counter() - started) * 1e6
            # The turn's shape and verb, timed on their own: the pipeline measures them beside the size.
            started = time.perf_counter()
            new, reply, verb = turn_shape(req.messages)
            cell = turn_cell((new, reply), verb)
            turn_micros = (time.perf_counter() - started) * 1e6
            feats = replace(
                request_features(req, size.tokens, {}, None, size), requested_model="replay",
                warm_model=BACKEND if warm else None, warm_tokens=warm, warm_cached=warm_cached,
            )  # fmt: skip
            est = self.decider.decide(feats).estimate(BACKEND)
            assert est is not None
            true = int(usage["prompt_tokens"])
            exact_pending: tuple[int, int] | None = None
            fits: dict[int, tuple[bool, bool]] = {}
            for w in WINDOWS:
                wf = replace(feats, requested_model=f"w{w}")
                if not size.settled and self.decider.size_matters(wf, size.low, size.high):
                    # What Pipeline.decide does: a hard limit is never decided on a guess.
                    if exact_pending is None:
                        exact_pending = self.sizer.counted(size, self._exact(size))
                    wf = replace(wf, prompt_tokens=exact_pending[0], prompt_anchor=exact_pending[1])
                fits[w] = (self._keeps(wf), self._keeps(_provider(wf, true)))
            chars = [len(item_text(m)[1]) for m in req.messages]
            base = {
                "chars4": round(sum(chars) / 4),
                "o200k": self.exact.count_request(req),
                "prev_chars4": (prev[1] + round(sum(chars[prev[0]:]) / 4)) if prev else round(sum(chars) / 4),
            }  # fmt: skip
            base_fits = {
                name: {w: self._keeps(_provider(replace(feats, requested_model=f"w{w}"), n)) for w in WINDOWS}
                for name, n in base.items()
            }
            rows.append(Row(
                t.instance_id, turn, size.anchored, true, est.prompt_tokens, size.tokens,
                int(usage.get("completion_tokens") or 0),
                est.output_tokens, _cost(usage.get("cost")), est.cost_usd,
                int(usage.get("cached_tokens") or 0), est.cached_tokens, warm, est.cacheable_tokens or 0,
                cell, est.cache_cell, micros, turn_micros, fits, base, base_fits,
            ))  # fmt: skip
            # Pipeline.finish, the call served with its usage (the sampled count runs on a thread there).
            if self.sizer.reported(size, true, BACKEND, self.ratio):
                self.sizer.learn_tail(size, true, BACKEND)
            warm, warm_cached, prev = true, _int(usage.get("cached_tokens")), (len(req.messages), true)
        return rows

    def _exact(self, size: Any) -> int:
        """What ``PromptSizer.settle`` counts (before ``counted``), without changing the router's state."""
        return size.exact + sum(self.exact.count_item(u.value) if u.slot != -2 else self.exact.count_tools(u.value)
                                for u in size.pending)  # fmt: skip

    def _keeps(self, feats: Features) -> bool:
        try:
            self.decider.decide(feats)
        except ContextTooLarge:
            return False
        return True


def _int(raw: Any) -> int | None:
    return int(raw) if isinstance(raw, int | float) else None


def _cost(raw: Any) -> float | None:
    return float(raw) if isinstance(raw, int | float) else None


def _provider(feats: Features, tokens: int) -> Features:
    """``feats`` with a prompt of ``tokens`` in the provider's own tokens (a count, not an estimate)."""
    return replace(feats, prompt_tokens=tokens, prompt_anchor=tokens, anchor_model=None)


def replay(
    trajectories: Iterable[Trajectory], learned: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Row]:
    r = Replayer(learned)
    return [row for t in trajectories for row in r.replay(t)]


def log_row(r: Row) -> RequestRecord:
    """The replayed call as the router's log keeps it (the columns ``fit_estimates`` reads)."""
    return RequestRecord(
        f"{r.task}#{r.turn}", float(r.turn), task_id=r.task, status=200, chosen_model=BACKEND,
        input_tokens=r.prompt, output_tokens=r.output, cache_read_tokens=r.cached, prompt_tokens_est=r.logged,
        candidates=[Estimate(BACKEND, r.prompt_est, r.output_est, r.cached_est, r.cost_est, output_cell=r.cell,
                             cacheable_tokens=r.cacheable or None, cache_cell=r.cache_cell)],
    )  # fmt: skip


def cross_validate(
    trajectories: Sequence[Trajectory], folds: int = 5, seed: int = 0
) -> tuple[dict[str, Any], list[Row]]:
    """The learned estimates measured on held-out tasks: the log of a router running on the priors
    (every trajectory replayed once), ``fit_estimates`` on the other folds' calls, each fold replayed
    with what was learned without it. The priors' own figures are in ``priors``. Returns the report
    and the held-out rows."""
    ids = [t.instance_id for t in trajectories]
    random.Random(seed).shuffle(ids)
    fold_of = {task: i % folds for i, task in enumerate(ids)}
    prior_rows = replay(trajectories)
    price = Replayer().backend.price
    rows: list[Row] = []
    fitted = []
    candidates: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for k in range(folds):
        train = [r for r in prior_rows if fold_of[r.task] != k]
        learned = fit_estimates(log_row(r) for r in train)
        fitted.append(learned.get(BACKEND))
        held = replay([t for t in trajectories if fold_of[t.instance_id] == k], learned)
        rows += held
        for name, cost in _candidates(train, held, learned.get(BACKEND) or {}, price).items():
            candidates[name] += cost
    report = summarize(rows)
    report["setup"] = {"folds": folds, "seed": seed, "fitted": fitted}
    report["priors"] = summarize(prior_rows)
    del report["priors"]["baselines"]
    priced = [i for i, r in enumerate(rows) if r.cost is not None]
    true = [rows[i].cost or 0.0 for i in priced]
    report["cost_candidates"] = {
        name: {"sum_ratio": _ratio([c[i] for i in priced], true), "median_ape": _median(_ape([c[i] for i in priced], true))}
        for name, c in candidates.items()
    }  # fmt: skip
    return report, rows


#: Other estimates of each held-out call's cost from the same fold's fit, beside the router's.
#: ``mean_output``: the backend's mean output, not its ``turn_cell``'s; ``turn_shapes``: the mean of
#: the cell's shape, not of the program the last turn ran (the router before ``turn_verb``);
#: ``one_share``: the backend's one cached share of the warm blocks, not its ``cache_cell``'s (the
#: router before cache cells); ``share``: a share of the whole prompt cached, not of the warm
#: prefix's whole blocks, with the mean output (the router before cache blocks and turn cells),
#: and ``share_turn_cells`` with the cell's. ``medians`` is not an estimate the router could use: the median output of the cell and
#: a cache hit (all the warm blocks cached) price a typical call, which is what a median error
#: rewards, and undercount the sum (the long replies and the misses are left out).
CANDIDATES: Final = ("mean_output", "turn_shapes", "one_share", "share", "share_turn_cells", "medians")


def _candidates(
    train: Sequence[Row], held: Sequence[Row], learned: Mapping[str, Any], price: Any
) -> dict[str, list[float]]:
    warm = [r for r in train if r.warm]
    share = sum(r.cached for r in warm) / max(1, sum(r.prompt for r in warm))
    mean = learned.get("output_mean") or statistics.fmean(r.output for r in train)
    cells = learned.get("output_cells") or {}
    hits = [r for r in warm if r.cached and r.cacheable]
    hit_share = sum(r.cached for r in hits) / max(1, sum(r.cacheable for r in hits))
    by_cell_outputs: dict[str, list[int]] = {}
    for r in train:
        for c in (r.cell, r.cell and parent_cell(r.cell)):
            if c is not None:
                by_cell_outputs.setdefault(c, []).append(r.output)
    median = statistics.median(r.output for r in train)
    medians = {c: statistics.median(v) for c, v in by_cell_outputs.items() if len(v) >= MIN_ROWS}
    one = learned.get("cache_share", 1.0)
    out: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    for r in held:
        by_cell = round(_or(cell_mean(cells, r.cell), mean))
        of_prompt = min(r.warm, round(r.prompt_est * share))
        out["mean_output"].append(price.cost(r.prompt_est - r.cached_est, round(mean), r.cached_est))
        shape = r.cell and (parent_cell(r.cell) or r.cell)
        out["turn_shapes"].append(
            price.cost(r.prompt_est - r.cached_est, round(_or(cell_mean(cells, shape), mean)), r.cached_est)
        )
        blocks = round(r.cacheable * one)
        out["one_share"].append(price.cost(r.prompt_est - blocks, r.output_est, blocks))
        out["share"].append(price.cost(r.prompt_est - of_prompt, round(mean), of_prompt))
        out["share_turn_cells"].append(price.cost(r.prompt_est - of_prompt, by_cell, of_prompt))
        all_cached = round(r.cacheable * hit_share)
        out["medians"].append(
            price.cost(r.prompt_est - all_cached, round(_or(cell_mean(medians, r.cell), median)), all_cached)
        )
    return out


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _ape(est: Sequence[float], true: Sequence[float]) -> list[float]:
    return [abs(e - t) / t for e, t in zip(est, true, strict=True) if t > 0]


def _median(xs: Sequence[float]) -> float | None:
    return round(statistics.median(xs), 6) if xs else None


def _ratio(est: Sequence[float], true: Sequence[float]) -> float | None:
    s = sum(true)
    return round(sum(est) / s, 6) if s else None


def _signed(est: Sequence[float], true: Sequence[float]) -> float | None:
    return _median([(e - t) / t for e, t in zip(est, true, strict=True) if t > 0])


def _prompt(rows: Sequence[Row], est: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, flag in (("anchored", True), ("unanchored", False)):
        idx = [i for i, r in enumerate(rows) if r.anchored is flag]
        e, t = [est[i] for i in idx], [rows[i].prompt for i in idx]
        out[name] = {"n": len(idx), "median_ape": _median(_ape(e, t)), "median_error": _signed(e, t),
                     "sum_ratio": _ratio(e, t)}  # fmt: skip
    return out


def _fit(rows: Sequence[Row], keeps: Sequence[dict[int, bool]]) -> dict[str, dict[str, int]]:
    ff = {
        str(w): sum(1 for r, k in zip(rows, keeps, strict=True) if k[w] and not r.fits[w][1]) for w in WINDOWS
    }
    fx = {
        str(w): sum(1 for r, k in zip(rows, keeps, strict=True) if not k[w] and r.fits[w][1]) for w in WINDOWS
    }
    return {"false_fits": ff, "false_excludes": fx}


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    """The report: the router's figures (the issue's keys) and the baselines' beside them."""
    out_e, out_t = [r.output_est for r in rows], [r.output for r in rows]
    priced = [r for r in rows if r.cost is not None]
    cost_e, cost_t = [r.cost_est for r in priced], [r.cost or 0.0 for r in priced]
    micros = sorted(r.micros for r in rows)
    report: dict[str, Any] = {
        "requests": len(rows),
        "tasks": len({r.task for r in rows}),
        "prompt": _prompt(rows, [r.prompt_est for r in rows]),
        "output": {"sum_ratio": _ratio(out_e, out_t), "median_ape": _median(_ape(out_e, out_t))},
        "cost": {
            "n": len(priced),
            "sum_ratio": _ratio(cost_e, cost_t),
            "median_ape": _median(_ape(cost_e, cost_t)),
        },
        "cache": {
            "sum_ratio": _ratio([r.cached_est for r in rows], [r.cached for r in rows]),
            "share": _ratio([r.cached for r in rows], [r.prompt for r in rows]),
            "share_est": _ratio([r.cached_est for r in rows], [r.prompt_est for r in rows]),
        },
        "fit": _fit(rows, [{w: r.fits[w][0] for w in WINDOWS} for r in rows]),
        "time": {
            "median_us": _median(micros),
            "p90_us": round(micros[int(0.9 * (len(micros) - 1))], 1) if micros else None,
            "median_us_with_turn": _median([r.micros + r.turn_micros for r in rows]),
        },
        "baselines": {
            name: {
                "prompt": _prompt(rows, [r.baselines[name] for r in rows]),
                "fit": _fit(rows, [r.baseline_fits[name] for r in rows]),
            }
            for name in BASELINES
        },
    }
    return report


def per_request(rows: Sequence[Row]) -> Iterable[dict[str, Any]]:
    for r in rows:
        yield {
            "task": r.task, "turn": r.turn, "anchored": r.anchored, "prompt": r.prompt, "prompt_est": r.prompt_est,
            "output": r.output, "output_est": r.output_est, "cost": r.cost, "cost_est": round(r.cost_est, 8),
            "cached": r.cached, "cached_est": r.cached_est, "micros": round(r.micros, 1),
            "fits": {str(w): list(v) for w, v in r.fits.items()}, "baselines": r.baselines,
        }  # fmt: skip
