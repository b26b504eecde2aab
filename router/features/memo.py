"""What the router remembers of each conversation's last requests, so a growing one costs only its tail.

An agent resends the whole conversation on every turn. Per conversation (the task id), the
last few requests are kept: references to their parsed messages, system and tools, with each
message's token count once it is known. A new request is compared with them message by message
(``a is b or a == b``: Python's C-level equality of two 400 KB conversations costs ~40 µs, far
less than hashing or serialising them), and only what follows the longest common prefix is new.
A request equal to a remembered one is a resend.

``cache_control`` markers are ignored in the comparison: Anthropic clients move them to the
last message on every turn, and they are neither counted nor part of what was asked.

Memory is bounded by the bytes of the request bodies remembered (LRU over conversations).
Counts are filled in later, from any thread (a list item or attribute assignment is atomic).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConversationMemo", "Match", "Snapshot", "same"]

#: Requests remembered per conversation: a side call (a title, a summary) or a retry sent between
#: two turns must not make the router forget the main conversation.
PER_KEY = 4
_VOLATILE = "cache_control"
_MAX_STRIP_DEPTH = 6


@dataclass(slots=True, eq=False)
class Snapshot:
    """One request as remembered. ``None`` counts are not known yet (the exact count is pending)."""

    messages: list[Any]
    counts: list[int | None]
    system: Any
    system_tokens: int | None
    tools: Any
    tools_tokens: int | None
    #: Bytes charged against the memory bound (about the request body's length).
    weight: int
    #: Per message, what a reader made of it (the signals' reading), None until read.
    facts: list[Any] = field(default_factory=list)
    #: ``(k, tokens)``: the provider's own count of a prompt made of this request's first ``k``
    #: messages with its system and tools (an earlier request of the conversation, as served).
    anchor: tuple[int, int] | None = None
    #: The backend that reported ``anchor`` (its tokens are that provider's), if known.
    anchor_model: str | None = None


@dataclass(frozen=True, slots=True)
class Match:
    """How a new request relates to the closest remembered one of its conversation."""

    snapshot: Snapshot | None = None
    #: The new request's first ``prefix`` messages equal the snapshot's.
    prefix: int = 0
    same_system: bool = False
    same_tools: bool = False
    #: The request is one of the conversation's last requests sent again, unchanged.
    repeat: bool = False


NO_MATCH = Match()


def _strip(value: Any, depth: int = 0) -> Any:
    """``value`` without ``cache_control`` keys (a copy of what holds them; the rest is shared)."""
    if depth > _MAX_STRIP_DEPTH:
        return value
    if type(value) is dict:
        return {k: _strip(v, depth + 1) for k, v in value.items() if k != _VOLATILE}
    if type(value) is list:
        return [_strip(v, depth + 1) for v in value]
    return value


def _marked(value: Any, depth: int = 0) -> bool:
    """Whether a ``cache_control`` key occurs in ``value`` (a walk of its containers, no copying)."""
    if depth > _MAX_STRIP_DEPTH:
        return False
    if type(value) is dict:
        return _VOLATILE in value or any(
            _marked(v, depth + 1) for v in value.values() if type(v) is dict or type(v) is list
        )
    if type(value) is list:
        return any(_marked(v, depth + 1) for v in value if type(v) is dict or type(v) is list)
    return False


def same(a: Any, b: Any) -> bool:
    """Equal, or equal but for ``cache_control`` markers (only tried when they differ)."""
    if a is b or a == b:
        return True
    if type(a) is not type(b) or type(a) not in (dict, list):
        return False
    try:
        # Most messages that differ simply differ: copying them without markers is only worth it
        # when there is a marker to drop.
        if not (_marked(a) or _marked(b)):
            return False
        return bool(_strip(a) == _strip(b))
    except RecursionError:
        return False


def common_prefix(new: list[Any], old: list[Any]) -> int:
    n = min(len(new), len(old))
    for i in range(n):
        a, b = new[i], old[i]
        if a is b or a == b:
            continue
        if not same(a, b):
            return i
    return n


class ConversationMemo:
    """Per-conversation snapshots of the last requests, bounded by ``max_bytes`` (0 disables)."""

    def __init__(self, max_bytes: int, per_key: int = PER_KEY) -> None:
        if max_bytes < 0 or per_key < 1:
            raise ValueError("max_bytes must be >= 0 and per_key >= 1")
        self.max_bytes = max_bytes
        self.per_key = per_key
        self._by_key: OrderedDict[str, list[Snapshot]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def match(self, key: str, messages: list[Any], system: Any, tools: Any) -> Match:
        """The remembered request of ``key`` sharing the longest message prefix with this one."""
        with self._lock:
            snaps = self._by_key.get(key)
            if snaps is None:
                self.misses += 1
                return NO_MATCH
            self._by_key.move_to_end(key)
            snaps = list(snaps)
        best: Snapshot | None = None
        prefix = 0
        for snap in snaps:  # most recent first
            limit = min(len(messages), len(snap.messages))
            if best is not None and (
                limit <= prefix
                or (limit == prefix + 1 and not same(messages[limit - 1], snap.messages[limit - 1]))
            ):
                # It cannot share more than the best so far, nor be this request again: agents'
                # retries and sibling calls differ only in their last message, and comparing that
                # one first spares a walk over everything before it.
                continue
            n = common_prefix(messages, snap.messages)
            if n > prefix or best is None:
                best, prefix = snap, n
            if n == len(snap.messages):
                break  # the conversation continues this request: nothing older can share more
        assert best is not None
        with self._lock:
            if prefix:
                self.hits += 1
            else:
                self.misses += 1
        same_system = same(system, best.system)
        same_tools = same(tools, best.tools)
        repeat = prefix == len(messages) == len(best.messages) and same_system and same_tools
        return Match(best, prefix, same_system, same_tools, repeat)

    def remember(self, key: str, snap: Snapshot, replaces: Snapshot | None = None) -> None:
        """Keep ``snap`` as ``key``'s latest request; ``replaces`` is one it makes redundant."""
        if snap.weight > self.max_bytes:
            return
        with self._lock:
            old = self._by_key.pop(key, [])
            kept = [snap, *(s for s in old if s is not replaces)][: self.per_key]
            self._by_key[key] = kept
            self._bytes += sum(s.weight for s in kept) - sum(s.weight for s in old)
            while self._bytes > self.max_bytes and len(self._by_key) > 1:
                _, evicted = self._by_key.popitem(last=False)
                self._bytes -= sum(s.weight for s in evicted)
            while self._bytes > self.max_bytes and len(kept) > 1:
                self._bytes -= kept.pop().weight
