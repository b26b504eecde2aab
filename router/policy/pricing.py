"""What a call costs on a backend: expected, held by a budget, and at worst. Pure numbers.

The expected cost ranks the candidates and prices the log; a budget holds the cost at the
output's high quantile (``hold_usd``), so that the last requests in flight can pay; a key's
budget also holds, out of what it has left, the most a call may cost (``worst_usd``: all the
output its backend allows, its cache missed, every hosted tool call it may make).
"""

from __future__ import annotations

from typing import Final

from router.features.request import Features
from router.policy.catalog import Backend
from router.policy.estimates import Estimates, cache_cell
from router.store.records import Estimate

__all__ = ["PRIORS", "estimate", "with_hosted_tools"]

#: What the estimates are before ``router train`` has learned any from the log.
PRIORS: Final = Estimates()


def estimate(
    backend: Backend, features: Features, expected_output: int, estimates: Estimates | None = None,
    prompt: int | None = None, hold_output: int | None = None,
) -> Estimate:  # fmt: skip
    """Tokens and dollars of this call on ``backend``, prompt caching included.

    ``prompt``: the prompt in the backend's tokens (default ``features.prompt_tokens``). The task's
    prefix is warm only on the backend it last used, within that provider's cache lifetime; the
    provider caches it in whole blocks, and the share of those ``estimates`` learned (a mean: a
    call hits or misses); anywhere else the whole prompt is new, and where the provider charges
    for cache writes (Anthropic) a switch pays them.
    ``hold_output``: the output a budget holds for (the cost at it is ``hold_usd``; without it, the
    hold is the expected cost). ``worst_usd`` is the cost at the most output the call may write.
    """
    est = estimates or PRIORS
    out = min(features.max_output_tokens or expected_output, expected_output, backend.max_output_tokens)
    prompt = features.prompt_tokens if prompt is None else prompt
    warm = min(features.warm_tokens, prompt) if features.warm_model == backend.id else 0
    cacheable = est.cacheable(backend.provider, warm)
    cell = cache_cell(backend.provider, cacheable, features.warm_cached)
    cached = round(cacheable * est.cache_share(backend.id, cell))
    fresh = prompt - cached
    writes = fresh if backend.protocol == "anthropic" else 0
    price = backend.price.at(prompt)
    # A fee billed for every call (a search model's search) is part of every figure below.
    cost = price.cost(fresh - writes, out, cached, writes) + price.per_request
    e = Estimate(backend.id, prompt, out, cached, cost, hold_usd=cost, cacheable_tokens=cacheable or None)
    e.cache_cell = cell
    if hold_output is not None:
        held = min(features.max_output_tokens or hold_output, hold_output, backend.max_output_tokens)
        e.hold_usd = cost + max(0, held - out) * price.output
    most = min(features.max_output_tokens or backend.max_output_tokens, backend.max_output_tokens)
    # At most, the prompt's cache may also have missed: all of it new, and where the provider
    # charges for writing it to the cache (Anthropic), written, at the dearer lifetime's price. A
    # prompt naming a document the provider fetches may fill the window: a key with $0.01 held
    # $0.000225 for each of such requests at once, which the provider bills up to $0.60 each.
    whole = max(prompt, backend.context_window) if features.unseen else prompt
    at_most = backend.price.at(whole)
    cold = whole * at_most.input
    if backend.protocol == "anthropic":
        cold = max(cold, at_most.write_cost(whole), at_most.write_cost(whole, whole))
    cold += at_most.per_request
    e.worst_usd = max(
        e.hold_usd or cost, cost + max(0, most - out) * price.output, cold + most * at_most.output
    )
    return e


def with_hosted_tools(e: Estimate, backend: Backend, features: Features, held: int, most: int) -> Estimate:
    """``e`` with the fees of the hosted tools the request declares: billed per call, whatever the
    tokens, a budget holds for ``held`` calls of each, or the fewer the request allows (the
    provider makes no more); the worst case, for the calls the request allows, else ``most`` (none
    is known before the reply).

    Not on a Chat Completions backend: its replies show no hosted call, so none is ever charged
    there (a Responses web_search reaches it as litellm's web_search_options, which only OpenAI's
    search models act on), and a hold for them only refused requests."""
    if not features.hosted_tools or backend.protocol == "openai":
        return e
    caps, most = dict(features.hosted_max_uses), max(most, held)
    calls = {kind: min(held, caps.get(kind, held)) for kind in features.hosted_tools}
    e.hold_usd = (e.hold_usd if e.hold_usd is not None else e.cost_usd) + backend.price.tools(calls)
    at_most = {kind: caps.get(kind, most) for kind in features.hosted_tools}
    e.worst_usd = max(e.hold_usd, (e.worst_usd or e.cost_usd) + backend.price.tools(at_most))
    return e
