"""How many output tokens a call will produce, per model, learned from the log.

A median (and 90th percentile) linear quantile regression of log output tokens on log prompt
tokens: replies grow slowly with context, and an agent's calls are mostly short tool calls with
a long tail. Too few rows for a model → its plain quantiles. The decision uses the median for the
expected cost of a call; the log's own estimate is replaced as soon as a model has a history.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from sklearn.linear_model import QuantileRegressor

from router.policy.artifact import OutputTokens
from router.store import RequestRecord

MIN_ROWS = 20
MAX_ROWS = 2000  # quantile regression is a linear program: keep it fast on a large log


def fit_output_tokens(requests: Iterable[RequestRecord]) -> dict[str, OutputTokens]:
    """Per model: the median and 90th percentile lines, log1p(out) = a + b·log1p(prompt)."""
    by_model: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in requests:
        model = r.chosen_model
        if r.status != 200 or r.side_call or not model:
            continue
        out, prompt = r.output_tokens, r.input_tokens or r.prompt_tokens_est
        if out is None or prompt is None or r.usage_estimated:
            continue
        by_model[model].append((math.log1p(prompt), math.log1p(out)))
    fitted = {}
    for model, pairs in by_model.items():
        data = np.array(pairs[-MAX_ROWS:])
        x, y = data[:, :1], data[:, 1]
        entry: dict[str, tuple[float, float]] = {}
        for name, q in (("q50", 0.5), ("q90", 0.9)):
            if len(pairs) >= MIN_ROWS and np.ptp(x) > 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # convergence chatter on tiny, degenerate logs
                    reg = QuantileRegressor(quantile=q, alpha=0.0, solver="highs").fit(x, y)
                entry[name] = (round(float(reg.intercept_), 6), round(float(reg.coef_[0]), 6))
            else:
                entry[name] = (round(float(np.quantile(y, q)), 6), 0.0)
        fitted[model] = OutputTokens(entry["q50"], entry["q90"], len(pairs))
    return fitted
