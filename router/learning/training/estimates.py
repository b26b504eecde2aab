"""Per backend, from the log: provider tokens per o200k token, the output of a call, the cached share.

What ``router.policy.estimates`` reads (the artifact's ``estimates``). Each number needs
``MIN_ROWS`` calls of its own; a backend with fewer keeps its prior.

* ``tokens_ratio``: the provider's reported prompt over the router's estimate, the median over the
  calls that started a task (no earlier count of the conversation anchored them, so the estimate
  is in o200k tokens; a median, as a few odd prompts would pull a sum's ratio off the typical one);
* ``output_mean`` and ``output_p90``: the reported output of the main loop's calls;
  ``output_cells``: its mean per ``turn_cell`` the decision logged, and per shape (the cell
  without its verb, ``parent_cell``), for each of ``MIN_ROWS`` calls (a mean per cell, so the
  cells' sum stays the log's);
* ``cache_share``: the reported cached tokens over the warm prefix's whole cache blocks the
  decision logged (``cacheable_tokens``), summed over the calls that had some. Rows from before
  it was logged count their ``cached_tokens`` instead (the whole warm prefix at the prior, a
  learned share of the prompt after: close, until newer rows come in). ``cache_cells``: the same
  share per ``cache_cell`` the decision logged, for each of ``MIN_ROWS`` calls.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Final

from router.policy.estimates import BackendEstimates, Estimates, parent_cell
from router.store import RequestRecord

MIN_ROWS: Final = 20


def fit_estimates(requests: Iterable[RequestRecord]) -> dict[str, dict[str, Any]]:
    """``{backend: {tokens_ratio, output_mean, output_p90, cache_share, output_cells, cache_cells, n}}``
    (only what was learned)."""
    outputs: dict[str, list[int]] = defaultdict(list)
    cells: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    cache: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    cache_cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))
    first: dict[str, tuple[float, str, int, int]] = {}  # task → (ts, backend, reported, estimated)
    for r in requests:
        model = r.chosen_model
        reported = r.input_tokens
        if r.status != 200 or not model or r.usage_estimated or not reported or r.side_call:
            continue
        chosen = next((c for c in r.candidates or () if c.model == model), None)
        if r.output_tokens is not None:
            outputs[model].append(r.output_tokens)
            if chosen is not None and chosen.output_cell:
                cells[model][chosen.output_cell].append(r.output_tokens)
                # Its shape's cell too: what a verb too rare to have a cell of its own is priced at.
                parent = parent_cell(chosen.output_cell)
                if parent is not None:
                    cells[model][parent].append(r.output_tokens)
        cacheable = chosen and (chosen.cacheable_tokens or chosen.cached_tokens)
        if chosen is not None and cacheable:
            # Its cell's too: a cell the log has too few calls of is priced at the backend's share.
            for c in (cache[model], *([cache_cells[model][chosen.cache_cell]] if chosen.cache_cell else ())):
                c[0] += r.cache_read_tokens or 0
                c[1] += cacheable
                c[2] += 1
        task, est = r.task_id, r.prompt_tokens_est
        if task and est and (task not in first or r.ts < first[task][0]):
            first[task] = (r.ts, model, reported, est)
    ratios: dict[str, list[float]] = defaultdict(list)
    for _, model, reported, est in first.values():
        ratios[model].append(reported / est)
    fitted: dict[str, dict[str, Any]] = defaultdict(dict)
    for model, outs in outputs.items():
        if len(outs) >= MIN_ROWS:
            outs.sort()
            fitted[model]["output_mean"] = round(sum(outs) / len(outs), 2)
            fitted[model]["output_p90"] = float(outs[min(len(outs) - 1, math.ceil(0.9 * len(outs)) - 1)])
            fitted[model]["n"] = len(outs)
            by_cell = {
                cell: round(sum(v) / len(v), 2) for cell, v in cells[model].items() if len(v) >= MIN_ROWS
            }
            if by_cell:
                fitted[model]["output_cells"] = by_cell
    for model, (read, blocks, n) in cache.items():
        if n >= MIN_ROWS and blocks > 0:
            fitted[model]["cache_share"] = round(min(1.0, read / blocks), 4)
            shares = {
                cell: round(min(1.0, r / b), 4)
                for cell, (r, b, k) in cache_cells[model].items()
                if k >= MIN_ROWS
            }
            if shares:
                fitted[model]["cache_cells"] = shares
    for model, rs in ratios.items():
        if len(rs) >= MIN_ROWS:
            fitted[model]["tokens_ratio"] = round(statistics.median(rs), 4)
    return dict(fitted)


def as_estimates(fitted: Mapping[str, Mapping[str, Any]]) -> Estimates:
    """``fit_estimates``' numbers as the artifact holds them."""

    def get(e: Mapping[str, Any], name: str) -> float | None:
        return float(e[name]) if name in e else None

    return Estimates({
        backend: BackendEstimates(
            get(e, "tokens_ratio"), get(e, "output_mean"), get(e, "output_p90"), get(e, "cache_share"),
            n=int(e["n"]) if "n" in e else None,
            output_cells={k: float(v) for k, v in e["output_cells"].items()} if "output_cells" in e else None,
            cache_cells={k: float(v) for k, v in e["cache_cells"].items()} if "cache_cells" in e else None,
        )
        for backend, e in fitted.items()
    })  # fmt: skip
