"""A request's prompt size on the request path: exact where known, estimated within hard bounds where not.

Tokenizing is the router's most expensive step (tiktoken reads ~10 MB/s: 0.4 ms for a 4 KB
tool result, 45 ms for a new 100k-token conversation). So ``measure`` adds up what is already
known — the counts of the conversation's earlier requests (``ConversationMemo``) and
``TokenCounter``'s cache — and estimates the rest from its text length; a short prompt nothing
anchors (a conversation's first request) is then counted once (``wants_count``).
The estimate carries hard bounds: an unknown text has at least 0 and at most as many tokens as
UTF-8 bytes (a BPE token is at least one byte). ``settle`` counts the estimated parts exactly
and remembers them, so the next turn knows them; the proxy runs it off the request path, or
before deciding when the bounds straddle something the decision depends on (``Decider.size_matters``).

Once a request has been served, the provider's reported input tokens are its exact size
(``reported``): the conversation's next turn starts from that count (the *anchor*) and estimates
only the messages added since, and nothing is tokenized unless a decision depends on the bounds.
Counting every new tool output with tiktoken was a tenth of the router's CPU on real agent traffic,
to learn a number the provider states anyway.

Units. The anchor is in the provider's tokens, which are also what limits its context window and
what it bills, and so is the estimate of the messages that follow it (at the characters per
token that provider's counts taught, ``provider_chars_per_token``): ``PromptSize.provider_tokens``.
Everything else is in o200k tokens (counted, or estimated at ``chars_per_token``, which only
o200k counts teach); the decision converts it with each backend's provider/o200k ratio
(``router.policy.estimates``).

Estimate and exact count agree on everything but the text tokens: both read an item through
``tokens.item_text`` (overheads, images, tool calls, ...).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Final

from router.features.memo import NO_MATCH, ConversationMemo, Snapshot
from router.features.tokens import REPLY_PRIMING, TokenCounter, item_text, tools_text
from router.protocols.common import OPENAI_CHAT, ClientRequest

__all__ = ["PromptSize", "PromptSizer"]

#: Characters per token before any exact count has been seen (English prose and code: 3.5-4.5).
DEFAULT_CHARS_PER_TOKEN: Final = 3.6
#: Pending text up to this size is counted on the event loop once the reply is out: tokenizing it
#: (~10 µs per 200 characters) costs less than handing it to a thread (~40 µs of the loop's time,
#: and the GIL). Longer text is counted on a worker thread.
INLINE_CHARS: Final = 512
#: Pending text up to this size is counted on the event loop when the decision waits for the count
#: (bounds that straddle a window, a conversation's first request): tiktoken takes ~40 µs a KB here,
#: 0.66 ms for 16 KB. The request waits for the count either way, and on a worker thread it waited
#: longer: handing it over and taking the GIL back (from the log's writer thread, too) cost more
#: than the count (replayed turns: 0.41 ms mean for the counted turns' size check and count against
#: 0.23 ms inline, p90 0.81 against 0.51 ms). Longer text still goes to a worker thread.
DECIDING_INLINE_CHARS: Final = 16_384
#: A prompt no provider count anchors (a conversation's first request) is counted exactly before
#: deciding when what is unknown of it is this short (~8k tokens, under 2 ms on a worker thread; the system prompt
#: and tools are usually known already from another conversation): its o200k count times the
#: backend's provider/o200k ratio is within 2 % where characters are within 4-5 %, and it is
#: counted once per conversation (the provider's count anchors the next turn).
COUNT_NEW_CHARS: Final = 32_768
#: One anchored request in this many has its new messages counted once the provider has reported
#: the prompt (off the request path): per backend, the provider's tokens over the o200k tokens of
#: a conversation's tail convert what ``settle`` counts of a later tail. Tool output counts more
#: provider tokens per o200k token than the opening prose the learned ratio is fitted on (Gemini:
#: about 1.16 against 1.10), and near a window that difference is a false fit.
TAIL_SAMPLE: Final = 8
#: o200k tokens of sampled tails before their ratio is used (the backend's ratio until then).
_TAIL_MIN_TOKENS: Final = 20_000
#: Once a backend's sampled tails hold this many o200k tokens, one anchored request in
#: ``TAIL_SAMPLE_SETTLED`` is sampled: the ratio is a sum over hundreds of tails by then, and each
#: sample is a tiktoken count of the new messages, at 1 in 8 2.6 % of a replayed turn's
#: instructions (4.6 % Anthropic shape). `router eval-sizes` reads the same error either way.
_TAIL_SETTLED_TOKENS: Final = 5 * _TAIL_MIN_TOKENS
TAIL_SAMPLE_SETTLED: Final = 64
#: The learned ratio forgets past counts once it has read this many characters.
_HORIZON_CHARS: Final = 4_000_000
_SYSTEM: Final = -1
_TOOLS: Final = -2


@dataclass(slots=True)
class _Unknown:
    """A part of the prompt whose count is not known: where it goes, and what the estimate read."""

    slot: int  # a message index, or _SYSTEM / _TOOLS
    value: Any
    fixed: int
    chars: int


@dataclass(slots=True)
class PromptSize:
    #: The best estimate (exact when nothing is pending).
    tokens: int
    #: The part already counted exactly (the rest is pending).
    exact: int
    #: Hard bounds: the exact count is within [low, high].
    low: int
    high: int
    #: The request repeats one of its conversation's last requests.
    repeat: bool = False
    #: Leading messages shared with a remembered request of the conversation (0: a memo miss).
    remembered: int = 0
    pending: list[_Unknown] = field(default_factory=list)
    snapshot: Snapshot | None = None
    #: ``exact`` starts from a provider's count of an earlier request (``Snapshot.anchor``).
    anchored: bool = False
    #: That count (0 without an anchor) and the backend that reported it: those tokens are its
    #: provider's, the rest of ``tokens`` is o200k (``router.policy.estimates`` converts per backend).
    anchor_tokens: int = 0
    anchor_model: str | None = None
    #: The part of ``tokens`` in ``anchor_model``'s provider tokens: the anchor and the estimate of
    #: what followed it (0 without an anchor).
    provider_tokens: int = 0
    #: The characters of the pending parts' text (kept as they are added: a sum over the 160,000
    #: messages of a large body, read three times a request, held the event loop for 0.1 s).
    pending_chars: int = 0

    @property
    def settled(self) -> bool:
        return not self.pending

    @property
    def facts(self) -> list[Any] | None:
        """Per-message slots for what readers make of the messages, kept with the conversation."""
        return self.snapshot.facts if self.snapshot is not None else None


class PromptSizer:
    """``measure`` on the request path, ``settle`` anywhere (thread-safe; tiktoken releases the GIL)."""

    def __init__(
        self,
        counter: TokenCounter,
        memo: ConversationMemo,
        chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
        count_new_chars: int = 0,
    ) -> None:
        """``count_new_chars``: count a prompt without an anchor exactly before deciding when its
        unknown text is at most this long (``wants_count``; 0: never; the router uses ``COUNT_NEW_CHARS``)."""
        self.counter = counter
        self.memo = memo
        self.count_new_chars = count_new_chars
        self._lock = threading.Lock()
        # Characters and o200k tokens of the texts counted so far (decayed): their ratio is the
        # estimate's where nothing anchors it.
        self._o200k = _Rate(chars_per_token)
        # Per backend, characters and its provider's tokens of the messages that followed an anchor
        # (the difference between two reported counts): the rate of a conversation's new tail.
        self._provider: dict[str | None, _Rate] = {}
        # Per backend, provider and o200k tokens of the sampled tails (``learn_tail``).
        self._tail: dict[str, list[float]] = {}
        self._tails_seen = 0

    @property
    def chars_per_token(self) -> float:
        """Characters per o200k token."""
        return self._o200k.value

    def provider_chars_per_token(self, model: str | None) -> float:
        """Characters per token of ``model``'s provider, as its reported counts taught it (else o200k's)."""
        rate = self._provider.get(model)
        return rate.value if rate is not None else self._o200k.value

    def measure(self, req: ClientRequest, key: str | None, weight: int) -> PromptSize:
        """Known counts plus estimates; remembers the request under ``key`` (the task id)."""
        messages = req.messages if isinstance(req.messages, list) else [req.messages]
        # Chat's system prompt is a message; the others count it apart, as TokenCounter does.
        system = req.system if req.protocol != OPENAI_CHAT and req.system else None
        tools = req.tools or None
        memo = self.memo
        match = memo.match(key, messages, system, tools) if key and memo.max_bytes else NO_MATCH
        old = match.snapshot
        counts: list[int | None] = [None] * len(messages)
        facts: list[Any] = [None] * len(messages)
        if old is not None:
            counts[: match.prefix] = old.counts[: match.prefix]
            if len(old.facts) == len(old.messages):
                facts[: match.prefix] = old.facts[: match.prefix]
        snap = Snapshot(
            messages, counts, system, old.system_tokens if old and match.same_system else None,
            tools, old.tools_tokens if old and match.same_tools else None, weight, facts,
        )  # fmt: skip
        size = PromptSize(0, 0, 0, 0, match.repeat, match.prefix, [], snap)
        # The provider counted an earlier request this one extends (same system and tools, its
        # first k messages unchanged): only what follows them is looked at.
        anchor = old.anchor if old is not None and match.same_system and match.same_tools else None
        if anchor is not None and anchor[0] <= match.prefix:
            start, size.exact, size.anchored = anchor[0], anchor[1], True
            size.anchor_tokens, size.anchor_model = anchor[1], old.anchor_model if old is not None else None
            # Kept if this request gets no count of its own (a failure).
            snap.anchor, snap.anchor_model = anchor, size.anchor_model
        else:
            # Only the new tail is looked at one by one (and earlier messages still being counted).
            start = match.prefix if None not in counts[: match.prefix] else 0
            size.exact = REPLY_PRIMING
        # An anchored tail is estimated in the anchor's provider tokens, the rest in o200k.
        ratio = self.provider_chars_per_token(size.anchor_model) if size.anchored else self.chars_per_token
        for i in range(start, len(messages)):
            if counts[i] is None:
                counts[i] = self.counter.peek_item(messages[i])
                if counts[i] is None:
                    self._estimate(size, i, messages[i], ratio)
        if size.anchored:
            size.provider_tokens = size.anchor_tokens + size.tokens
        # The known counts (a None is pending, a 0 adds nothing); an anchor covers those before it.
        size.exact += sum(filter(None, counts[start:] if size.anchored else counts))
        if not size.anchored:
            if system is not None:
                snap.system_tokens = self._part(size, _SYSTEM, system, snap.system_tokens, ratio)
            if tools is not None:
                snap.tools_tokens = self._part(size, _TOOLS, tools, snap.tools_tokens, ratio)
        size.tokens += size.exact
        size.low += size.exact
        size.high += size.exact
        if key and memo.max_bytes:
            extends = old is not None and match.prefix == len(old.messages)
            memo.remember(key, snap, replaces=old if extends else None)
        return size

    def wants_count(self, size: PromptSize) -> bool:
        """Whether to count ``size`` exactly before deciding although no limit is near: a prompt no
        provider count anchors whose unknown part is short (``count_new_chars``)."""
        return not size.anchored and bool(size.pending) and size.pending_chars <= self.count_new_chars

    def _part(self, size: PromptSize, slot: int, value: Any, known: int | None, ratio: float) -> int | None:
        """The system prompt's or the tools' count: remembered, cached, or estimated (None)."""
        if known is None:
            known = self.counter.peek_tools(value) if slot == _TOOLS else self.counter.peek_item(value)
        if known is None:
            self._estimate(size, slot, value, ratio)
        else:
            size.exact += known
        return known

    def _estimate(self, size: PromptSize, slot: int, value: Any, ratio: float) -> None:
        if slot == _TOOLS:
            fixed, text = 0, tools_text(value)
        else:
            fixed, text = item_text(value)
        # A token is at least one UTF-8 byte (isascii is O(1); encoding happens only for the rest).
        utf8 = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        guess = min(utf8, round(len(text) / ratio))
        size.pending.append(_Unknown(slot, value, fixed, len(text)))
        size.pending_chars += len(text)
        size.tokens += fixed + guess
        size.low += fixed
        size.high += fixed + utf8

    def reported(
        self, size: PromptSize, input_tokens: int, model: str | None = None, ratio: float = 1.0
    ) -> bool:
        """The provider's count of the prompt it was sent: the conversation's next turn starts there.

        ``model`` served it and counts ``ratio`` of its provider's tokens per o200k token. What was
        pending stays uncounted (the anchor covers it); when the estimate started from an anchor by
        the same backend, the difference teaches that backend's characters per token. Returns whether
        to count the new messages (``learn_tail``, off the request path): one such request in
        ``TAIL_SAMPLE``, in ``TAIL_SAMPLE_SETTLED`` once ``model``'s tails are counted enough."""
        snap = size.snapshot
        if snap is None:
            return False
        snap.anchor, snap.anchor_model = (len(snap.messages), input_tokens), model
        sample = False
        if size.anchored and size.pending and size.anchor_model == model:
            if (
                model is not None and size.exact == size.anchor_tokens
            ):  # all the tail pending: its count is the tail's
                self._tails_seen += 1
                sample = self._tails_seen % self._tail_every(model) == 0
            # The tail's own tokens: less the anchor, the o200k counts known (in this provider's
            # tokens) and the fixed overheads.
            known = (size.exact - size.anchor_tokens) * ratio
            tokens = round(input_tokens - size.anchor_tokens - known - sum(u.fixed for u in size.pending))
            if tokens > 0:
                with self._lock:
                    rate = self._provider.get(model)
                    if rate is None:
                        rate = self._provider[model] = _Rate(self._o200k.value / ratio)
                    rate.learn(size.pending_chars, tokens)
        return sample

    def learn_tail(self, size: PromptSize, input_tokens: int, model: str) -> None:
        """Count a reported request's new messages exactly: their provider/o200k ratio for ``model``."""
        o200k = 0
        for u in size.pending:
            try:
                o200k += (
                    self.counter.count_tools(u.value)
                    if u.slot == _TOOLS
                    else self.counter.count_item(u.value)
                )
            except RuntimeError:
                return  # changed while being read: this sample is lost
        provider = input_tokens - size.anchor_tokens
        if o200k > 0 and provider > 0:
            with self._lock:
                acc = self._tail.setdefault(model, [0.0, 0.0])
                acc[0] += provider
                acc[1] += o200k
                if acc[1] > _HORIZON_CHARS / 4:
                    acc[0] /= 2
                    acc[1] /= 2

    def _tail_every(self, model: str) -> int:
        """One anchored request of ``model`` in this many has its tail counted (``learn_tail``)."""
        acc = self._tail.get(model)
        return TAIL_SAMPLE_SETTLED if acc is not None and acc[1] >= _TAIL_SETTLED_TOKENS else TAIL_SAMPLE

    def tail_ratio(self, model: str | None) -> float | None:
        """``model``'s provider tokens per o200k token of conversation tails, once sampled enough."""
        acc = self._tail.get(model) if model is not None else None
        return acc[0] / acc[1] if acc is not None and acc[1] >= _TAIL_MIN_TOKENS else None

    def counted(self, size: PromptSize, exact: int) -> tuple[int, int]:
        """A size counted exactly (``exact``: the anchor and o200k counts): its total and the part of
        it in the anchor's provider tokens. With a tail ratio learned for the anchor's backend the
        counted tail is converted here, else the decision converts it at the backend's ratio."""
        ratio = self.tail_ratio(size.anchor_model) if size.anchored else None
        if ratio is None:
            return exact, size.anchor_tokens
        total = size.anchor_tokens + round((exact - size.anchor_tokens) * ratio)
        return total, total

    def settle(self, size: PromptSize) -> int:
        """Count the pending parts exactly, remember their counts, return the exact total."""
        snap = size.snapshot
        chars = tokens = 0
        left: list[_Unknown] = []
        for u in size.pending:
            try:
                n = (
                    self.counter.count_tools(u.value)
                    if u.slot == _TOOLS
                    else self.counter.count_item(u.value)
                )
            except RuntimeError:
                # Changed while being read (off the request path, the request travels on): it
                # stays unknown, and the next turn estimates it again.
                left.append(u)
                continue
            if snap is not None:
                if u.slot == _TOOLS:
                    snap.tools_tokens = n
                elif u.slot == _SYSTEM:
                    snap.system_tokens = n
                else:
                    snap.counts[u.slot] = n
            size.exact += n
            chars += u.chars
            tokens += n - u.fixed
        size.pending = left
        size.pending_chars = sum(u.chars for u in left)
        if not left:
            size.exact, size.provider_tokens = self.counted(size, size.exact)
            size.tokens = size.low = size.high = size.exact
        if tokens > 0:
            with self._lock:
                self._o200k.learn(chars, tokens)
        return size.tokens


class _Rate:
    """Characters per token over the texts seen (decayed past ``_HORIZON_CHARS``); not thread-safe."""

    __slots__ = ("chars", "tokens")

    def __init__(self, chars_per_token: float) -> None:
        self.chars = chars_per_token * 1000
        self.tokens = 1000.0

    @property
    def value(self) -> float:
        return self.chars / self.tokens

    def learn(self, chars: int, tokens: int) -> None:
        self.chars += chars
        self.tokens += tokens
        if self.chars > _HORIZON_CHARS:
            self.chars /= 2
            self.tokens /= 2
