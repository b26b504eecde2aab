"""Tokens and dollars of one request, from the provider's usage and the catalog's prices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.features.bpe import default_encoding
from router.forward.execute import Try
from router.policy.catalog import Backend, Catalog, Price
from router.policy.decide import Decision
from router.protocols.common import ClientRequest, Usage
from router.store.records import Estimate


def fill_missing(usage: Usage, prompt_tokens_est: int, output_est: int, unseen: int = 0) -> bool:
    """Estimate what the provider did not report; return whether anything was estimated.

    ``output_est``: the output's estimate in tokens: for a stream cut short, ``streamed_tokens`` (at
    least its count of content events); for a whole reply, ``written_tokens``. A count of 0 is
    taken as unreported where it cannot be true — no prompt is empty, and there was output — since
    litellm writes zeros for a usage the provider did not send. ``unseen``: the output a call that reasons may have
    produced without showing it (``hidden_output``); the estimate is at least that.
    """
    estimated = False
    if not usage.input_tokens:
        usage.input_tokens = prompt_tokens_est
        estimated = True
    if usage.output_tokens is None or (usage.output_tokens == 0 and output_est > 0):
        usage.output_tokens = max(output_est, unseen)
        estimated = True
    return estimated


def reasons(req: ClientRequest, backend: Backend) -> bool:
    """Whether the call thinks unseen: the request asks it to, or the model reasons by default and
    the request did not turn it off. A catalog model that can think is taken to, unless it is
    Anthropic's, whose models think only when asked (OpenAI's reasoning models think at medium
    effort when the request says nothing)."""
    if req.thinking:
        return True
    default = backend.thinking and backend.protocol != "anthropic" and backend.provider != "anthropic"
    return default and req.reasoning_effort not in ("none", "minimal")


def hidden_output(req: ClientRequest, backend: Backend, est: Estimate | None) -> int:
    """What a call that reasons (``reasons``) may have produced unseen, for when its provider
    reports no usage.

    A reasoning model's thinking is billed as output but mostly not streamed (OpenAI's and the
    Responses API's are hidden; Anthropic streams its own), and comes before the first visible
    token: a stream cut after that token, or a call given up on before it, was billed for it.
    Its size is unknown then; the call's expected output (learned from the output providers
    report, reasoning included) is the estimate — a whole call's, so a stream cut early may be
    charged for some text it never wrote."""
    return est.output_tokens if est is not None and reasons(req, backend) else 0


#: Fields of a reply that are not what the model wrote.
_NOT_WRITTEN = frozenset({
    "id", "object", "type", "role", "model", "index", "finish_reason", "stop_reason", "stop_sequence",
    "status", "call_id", "signature", "logprobs", "annotations", "encrypted_content",
})  # fmt: skip


def written_tokens(obj: Mapping[str, Any]) -> int:
    """Tokens the model wrote in a whole reply of any protocol (text, reasoning, tool calls): the
    output's estimate for a reply that came without usage. Only then: it tokenizes the reply."""
    texts: list[str] = []
    _collect(obj.get("choices") or obj.get("content") or obj.get("output"), texts, 0)
    return len(default_encoding().encode_ordinary("\n".join(texts))) if texts else 0


def streamed_tokens(written: list[Any]) -> int:
    """Tokens of what a stream's content events carried (``StreamObserver.written``): the output's
    estimate for a stream cut before its usage. An event carries a token at OpenAI, several at
    Anthropic, hundreds through some translations: counted per event, a stream of 6 large events
    cut before its end was charged 6 tokens of the 4,800 it had sent."""
    texts: list[str] = []
    _collect(written, texts, 0)
    return len(default_encoding().encode_ordinary("".join(texts))) if texts else 0


def _collect(value: Any, texts: list[str], depth: int) -> None:
    if isinstance(value, str):
        texts.append(value)
    elif depth > 32:
        return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _NOT_WRITTEN:
                _collect(item, texts, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _collect(item, texts, depth + 1)


@dataclass(frozen=True, slots=True)
class CostSplit:
    """USD by what was paid for; ``input`` is the uncached part of the prompt, ``tools`` the
    hosted tools' calls. The parts add up to ``cost_usd`` up to rounding in the tenth decimal."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    tools: float = 0.0

    @property
    def total(self) -> float:
        return round(self.input + self.output + self.cache_read + self.cache_write + self.tools, 10)

    def __add__(self, other: CostSplit) -> CostSplit:
        return CostSplit(
            round(self.input + other.input, 10), round(self.output + other.output, 10),
            round(self.cache_read + other.cache_read, 10), round(self.cache_write + other.cache_write, 10),
            round(self.tools + other.tools, 10),
        )  # fmt: skip


def cost_split(price: Price, usage: Usage) -> CostSplit:
    price = price.at(usage.input_tokens or 0)  # a long prompt's call is billed at the long prices
    read = usage.cache_read_tokens or 0
    write = usage.cache_write_tokens or 0
    uncached = max(0, (usage.input_tokens or 0) - read - write)
    return CostSplit(
        input=round(uncached * price.input, 10),
        output=round((usage.output_tokens or 0) * price.output, 10),
        cache_read=round(read * price.cache_read, 10),
        cache_write=round(price.write_cost(write, usage.cache_write_1h_tokens or 0), 10),
        # A fee billed for every call (a search model's search) is the hosted tools' too.
        tools=round(price.tools(usage.tool_calls) + price.per_request, 10),
    )


@dataclass(frozen=True, slots=True)
class Charge:
    """What one served request cost: the backend's usage (gaps estimated) at its prices."""

    usage: Usage
    estimated: bool
    split: CostSplit
    #: The prompt's tokens as the provider reported them (None: not reported, ``usage`` estimates them).
    reported_input_tokens: int | None = None


def charge(
    backend: Backend, usage: Usage, prompt_tokens_est: int, output_est: int, unseen: int = 0
) -> Charge:
    reported = usage.input_tokens
    estimated = fill_missing(usage, prompt_tokens_est, output_est, unseen)
    return Charge(usage, estimated, cost_split(backend.price, usage), reported)


def given_up(
    served: Charge | None, tries: list[Try], req: ClientRequest, decision: Decision, catalog: Catalog
) -> Charge | None:
    """``served`` (None: no backend served) with what the tries that did not serve were billed.

    A try whose provider reported what it billed as it failed (``Try.usage``) is charged that. A
    try abandoned by a timeout while its backend worked (``Try.billed``) reports no usage and is
    charged the router's estimate: a whole reply's or a call that reasons (``reasons``) at the
    call's estimate, prompt and output, since its backend was writing it unseen; a stream given up
    before its first token on a model that does not reason, its prompt. Each such try's cost is in
    its log entry."""
    billed = _unserved(tries, req, decision, catalog)
    if not billed:
        return served
    total = served.split if served is not None else _NOTHING
    for t, usage, _ in billed:
        split = cost_split(catalog[t.model].price, usage)
        t.cost_usd = split.total
        total = total + split
    estimated = any(e for _, _, e in billed)
    if served is not None:
        return Charge(served.usage, served.estimated or estimated, total, served.reported_input_tokens)
    usage = Usage(input_tokens=sum(u.input_tokens or 0 for _, u, _ in billed),
                  output_tokens=sum(u.output_tokens or 0 for _, u, _ in billed))  # fmt: skip
    return Charge(usage, estimated, total)


def unserved_cost(tries: list[Try], req: ClientRequest, decision: Decision, catalog: Catalog) -> CostSplit:
    """What the tries that did not serve were billed, as ``given_up`` charges them, without
    writing it into the tries (``given_up`` does, once the request has ended)."""
    total = _NOTHING
    for t, usage, _ in _unserved(tries, req, decision, catalog):
        total = total + cost_split(catalog[t.model].price, usage)
    return total


_NOTHING = CostSplit(0.0, 0.0, 0.0, 0.0)


def _unserved(
    tries: list[Try], req: ClientRequest, decision: Decision, catalog: Catalog
) -> list[tuple[Try, Usage, bool]]:
    """The tries the provider billed without their serving: each with its usage, and whether that
    is the router's estimate."""
    billed: list[tuple[Try, Usage, bool]] = []
    for t in tries:
        if t.usage is not None:
            billed.append((t, t.usage, False))
        elif t.billed and (est := decision.estimate(t.model)):
            writing = not req.stream or reasons(req, catalog[t.model])
            billed.append((t, _estimated(est, est.output_tokens if writing else 0), True))
    return billed


def _estimated(est: Estimate, output_tokens: int) -> Usage:
    return Usage(input_tokens=est.prompt_tokens, output_tokens=output_tokens,
                 cache_read_tokens=est.cached_tokens or None)  # fmt: skip
