"""Tokens and dollars of one request, from the provider's usage and the catalog's prices."""

from __future__ import annotations

from router.catalog import Price
from router.protocols.common import Usage


def fill_missing(usage: Usage, prompt_tokens_est: int, output_events: int) -> bool:
    """Estimate what the provider did not report; return whether anything was estimated.

    A streamed content event carries about one token at every provider we relay, so the count
    of content events is the output estimate when no usage arrives (a stream cut short).
    """
    estimated = False
    if usage.input_tokens is None:
        usage.input_tokens = prompt_tokens_est
        estimated = True
    if usage.output_tokens is None:
        usage.output_tokens = output_events
        estimated = True
    return estimated


def cost_usd(price: Price, usage: Usage) -> float:
    read = usage.cache_read_tokens or 0
    write = usage.cache_write_tokens or 0
    uncached = max(0, (usage.input_tokens or 0) - read - write)
    return round(price.cost(uncached, usage.output_tokens or 0, read, write), 10)
