"""A request's prompt size on the request path: exact where known, estimated within hard bounds where not.

Tokenizing is the router's most expensive step (tiktoken reads ~10 MB/s: 0.4 ms for a 4 KB
tool result, 45 ms for a new 100k-token conversation). So ``measure`` only adds up what is
already known — the counts of the conversation's earlier requests (``ConversationMemo``) and
``TokenCounter``'s cache — and estimates the rest from its text length. The estimate carries
hard bounds: an unknown text has at least 0 and at most as many tokens as UTF-8 bytes (a BPE
token is at least one byte). ``settle`` counts the estimated parts exactly and remembers them,
so the next turn knows them; the proxy runs it off the request path, or before deciding when
the bounds straddle something the decision depends on (``Decider.size_matters``).

Once a request has been served, the provider's reported input tokens are its exact size
(``reported``): the conversation's next turn starts from that count (the *anchor*) and estimates
only the messages added since, and nothing is tokenized unless a decision depends on the bounds.
Counting every new tool output with tiktoken was a tenth of the router's CPU on real agent traffic,
to learn a number the provider states anyway. The anchor is in the provider's tokens, which are
also what limits its context window and what it bills.

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

    @property
    def settled(self) -> bool:
        return not self.pending

    @property
    def pending_chars(self) -> int:
        return sum(u.chars for u in self.pending)

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
    ) -> None:
        self.counter = counter
        self.memo = memo
        self._lock = threading.Lock()
        # Characters and tokens of the texts counted so far (decayed): their ratio is the estimate's.
        self._chars = chars_per_token * 1000
        self._tokens = 1000.0

    @property
    def chars_per_token(self) -> float:
        return self._chars / self._tokens

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
            snap.anchor = anchor  # kept if this request gets no count of its own (a failure)
        else:
            # Only the new tail is looked at one by one (and earlier messages still being counted).
            start = match.prefix if None not in counts[: match.prefix] else 0
            size.exact = REPLY_PRIMING
        ratio = self.chars_per_token
        for i in range(start, len(messages)):
            if counts[i] is None:
                counts[i] = self.counter.peek_item(messages[i])
                if counts[i] is None:
                    self._estimate(size, i, messages[i], ratio)
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
        size.tokens += fixed + guess
        size.low += fixed
        size.high += fixed + utf8

    def reported(self, size: PromptSize, input_tokens: int) -> None:
        """The provider's count of the prompt it was sent: the conversation's next turn starts there.

        What was pending stays uncounted (the anchor covers it); when the estimate started from an
        anchor too, the difference teaches the chars-per-token ratio in the provider's tokens."""
        snap = size.snapshot
        if snap is None:
            return
        snap.anchor = (len(snap.messages), input_tokens)
        if size.anchored and size.pending:
            tokens = input_tokens - size.exact - sum(u.fixed for u in size.pending)
            if tokens > 0:
                self._learn(size.pending_chars, tokens)

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
        if not left:
            size.tokens = size.low = size.high = size.exact
        if tokens > 0:
            self._learn(chars, tokens)
        return size.tokens

    def _learn(self, chars: int, tokens: int) -> None:
        with self._lock:
            self._chars += chars
            self._tokens += tokens
            if self._chars > _HORIZON_CHARS:
                self._chars /= 2
                self._tokens /= 2
