"""Tokens and dollars of one request, from the provider's usage and the catalog's prices."""

from __future__ import annotations

from dataclasses import dataclass

from router.policy.catalog import Backend, Price
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


@dataclass(frozen=True, slots=True)
class CostSplit:
    """USD by what was paid for; ``input`` is the uncached part of the prompt. The parts add up
    to ``cost_usd`` up to rounding in the tenth decimal."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    @property
    def total(self) -> float:
        return round(self.input + self.output + self.cache_read + self.cache_write, 10)


def cost_split(price: Price, usage: Usage) -> CostSplit:
    read = usage.cache_read_tokens or 0
    write = usage.cache_write_tokens or 0
    uncached = max(0, (usage.input_tokens or 0) - read - write)
    return CostSplit(
        input=round(uncached * price.input, 10),
        output=round((usage.output_tokens or 0) * price.output, 10),
        cache_read=round(read * price.cache_read, 10),
        cache_write=round(write * price.cache_write, 10),
    )


@dataclass(frozen=True, slots=True)
class Charge:
    """What one served request cost: the backend's usage (gaps estimated) at its prices."""

    usage: Usage
    estimated: bool
    split: CostSplit
    #: The prompt's tokens as the provider reported them (None: not reported, ``usage`` estimates them).
    reported_input_tokens: int | None = None


def charge(backend: Backend, usage: Usage, prompt_tokens_est: int, content_events: int) -> Charge:
    reported = usage.input_tokens
    estimated = fill_missing(usage, prompt_tokens_est, content_events)
    return Charge(usage, estimated, cost_split(backend.price, usage), reported)
