"""What the outcome label reads of a conversation: facts per message, then one vector per request.

Each message is read once (its facts are kept in the conversation memo's slot, next to the
signals' reading of it), so a growing conversation costs only its new messages; the vector is
a sum over the facts. Everything is read the same way whether the agent calls tools (OpenAI
``role: tool``, Anthropic ``tool_result``, Responses ``function_call_output``) or speaks the text
protocol (a fenced ``bash`` block, the result as the next user message): the features are
measured on what was said, not on how it was wrapped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from router.features.signals.conversation import Reading, slot
from router.features.signals.toolresult import test_summary
from router.features.signals.transcript import CALL_ITEMS, ToolCall, ToolResult

#: Every feature the reader computes, in a fixed order (an artifact names the ones it uses).
NAMES: Final = (
    "log_chars",  # log1p of the conversation's text (task, turns, tool output): big repos, long hunts
    "log_steps",  # log1p of the agent's turns so far
    "no_tests",  # no test-runner summary seen yet
    "tests_failing",  # the latest test run failed
    "repeats",  # share of tool calls that repeat an earlier call exactly
    "failed_rate",  # share of tool results that failed (non-zero exit, error flag)
    "format_errors",  # log1p of the turns the harness rejected as malformed
    "too_long",  # log1p of the results cut for being too long
)
#: How mini-swe-agent rejects a malformed turn: version 1, and version 2's tool-call and text templates.
_FORMAT_ERRORS: Final = ("Please always provide EXACTLY ONE action", "Tool call error:", "Format error:")
#: A result cut for length: version 1 says so first; version 2's JSON says so last.
_TOO_LONG: Final = ("The output of your last command was too long",)
_TOO_LONG_LAST: Final = ('"warning": "Output too long."',)
_SKIPPED_ROLES: Final = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Facts:
    """What one message says, for the label."""

    step: bool = False
    chars: int = 0
    calls: tuple[tuple[str, str], ...] = ()
    results: int = 0
    failed: int = 0
    #: The last test run in the message: True passed, False failed, None none.
    tests: bool | None = None
    format_error: bool = False
    too_long: int = 0


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            p if isinstance(p, str) else str(p.get("text") or "") for p in value if isinstance(p, str | dict)
        )
    return ""


def _call_chars(message: dict[str, Any]) -> int:
    """The size of a message's tool-call arguments (they are text the model wrote)."""
    n = 0
    calls = message.get("tool_calls")
    for c in calls if isinstance(calls, list) else ():
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            n += len(str(fn.get("arguments") or ""))
    content = message.get("content")
    for b in content if isinstance(content, list) else ():
        if isinstance(b, dict) and b.get("type") == "tool_use":
            n += len(str(b.get("input") or ""))
    if message.get("type") in ("function_call", "custom_tool_call"):
        n += len(str(message.get("arguments") or message.get("input") or ""))
    return n


def read(message: Any, reading: Reading) -> Facts:
    """The facts of one message, given the signals' reading of it (its tool events, each result
    with a glance: exit code and error flag); of each result only its test summary is read more."""
    if not isinstance(message, dict) or message.get("role") in _SKIPPED_ROLES:
        return Facts()
    events = [e for e, _ in reading.events]
    results = [(e, seen) for e, seen in reading.events if isinstance(e, ToolResult) and seen is not None]
    text = _text(message.get("content"))
    chars = max(len(text), sum(len(r.text) for r, _ in results)) + _call_chars(message)
    tests: bool | None = None
    failed = too_long = 0
    for r, seen in results:
        failed += seen.failed
        summary = test_summary(r.text)
        if summary is not None and summary.ok is not None:
            tests = summary.ok
        too_long += any(w in r.text[:1024] for w in _TOO_LONG) or any(
            w in r.text[-256:] for w in _TOO_LONG_LAST
        )
    role = message.get("role")
    # A chat or Messages message's "type" is the client's, unchecked: a list or an object cannot be
    # looked up in a set (a TypeError, and the task's weak label was lost).
    step = role == "assistant" or (isinstance(kind := message.get("type"), str) and kind in CALL_ITEMS)
    return Facts(
        step=step and not results,
        chars=chars,
        calls=tuple(e.key for e in events if isinstance(e, ToolCall)),
        results=len(results),
        failed=failed,
        tests=tests,
        format_error=role == "user" and not results and text.lstrip().startswith(_FORMAT_ERRORS),
        too_long=too_long,
    )


def conversation(messages: Sequence[Any], seen: list[Any] | None = None) -> list[Facts]:
    """The facts of every message, from (and into) the memo's slots when the caller keeps them."""
    out: list[Facts] = []
    for i, message in enumerate(messages):
        r = slot(messages, seen, i)
        if not isinstance(r.label, Facts):
            r.label = read(message, r)
        out.append(r.label)
    return out


def _tallied(seen: list[Any] | None, n_messages: int) -> tuple[int, Tally]:
    """How many leading messages the latest tally in the slots covers, and that tally."""
    if seen is not None and len(seen) == n_messages:
        for j in range(n_messages - 1, -1, -1):
            r = seen[j]
            tally = r.tally if r is not None else None
            if tally is not None:
                return j + 1, tally
    return 0, NO_TALLY


def unread(seen: list[Any] | None, n_messages: int, past: int | None = None) -> int:
    """How many of a conversation's messages ``features`` would read anew (not in their slots),
    or any number over ``past`` once more than ``past`` are: those after the latest tally, walked
    back from the last. A large body's conversation nothing has read yet was walked whole twice,
    on the event loop, to learn that it was more than a few."""
    if seen is None or len(seen) != n_messages:
        return n_messages
    n = 0
    for j in range(n_messages - 1, -1, -1):
        r = seen[j]
        if r is not None and r.tally is not None:
            break
        if r is None or not isinstance(r.label, Facts):
            n += 1
            if past is not None and n > past:
                break
    return n


@dataclass(frozen=True, slots=True)
class Tally:
    """The sums ``vector`` takes over the facts of a conversation's leading messages.

    Kept in the slot of the last message it covers (``Reading.tally``): an agent's next turn
    extends the conversation, and adds only its new messages' facts to it instead of summing
    over every message again. A slot is shared only by requests with the same messages up to
    it, so the tally found there is theirs too.
    """

    steps: int = 0
    chars: int = 0
    results: int = 0
    failed: int = 0
    format_errors: int = 0
    too_long: int = 0
    n_calls: int = 0
    distinct_calls: frozenset[tuple[str, str]] = frozenset()
    #: The latest test run: True passed, False failed, None none yet.
    last_tests: bool | None = None

    def plus(self, facts: Sequence[Facts]) -> Tally:
        if not facts:
            return self
        calls = [c for f in facts for c in f.calls]
        last_tests = next((f.tests for f in reversed(facts) if f.tests is not None), self.last_tests)
        return Tally(
            steps=self.steps + sum(f.step for f in facts),
            chars=self.chars + sum(f.chars for f in facts),
            results=self.results + sum(f.results for f in facts),
            failed=self.failed + sum(f.failed for f in facts),
            format_errors=self.format_errors + sum(f.format_error for f in facts),
            too_long=self.too_long + sum(f.too_long for f in facts),
            n_calls=self.n_calls + len(calls),
            distinct_calls=self.distinct_calls.union(calls) if calls else self.distinct_calls,
            last_tests=last_tests,
        )

    def vector(self) -> dict[str, float]:
        repeated = self.n_calls - len(self.distinct_calls)
        return {
            "log_chars": math.log1p(self.chars),
            "log_steps": math.log1p(self.steps),
            "no_tests": float(self.last_tests is None),
            "tests_failing": float(self.last_tests is False),
            "repeats": repeated / self.n_calls if self.n_calls else 0.0,
            "failed_rate": self.failed / self.results if self.results else 0.0,
            "format_errors": math.log1p(self.format_errors),
            "too_long": math.log1p(self.too_long),
        }


NO_TALLY: Final = Tally()


def vector(facts: Sequence[Facts]) -> dict[str, float]:
    """The features of a conversation (``NAMES``), from its messages' facts."""
    return NO_TALLY.plus(facts).vector()


def of(messages: Sequence[Any], seen: list[Any] | None = None) -> dict[str, float]:
    """``vector(conversation(messages, seen))``, adding to the tally an earlier request of the
    conversation left in the slots only the facts of the messages that came after it."""
    n = len(messages)
    start, tally = _tallied(seen, n)
    facts = []
    for i in range(start, n):
        r = slot(messages, seen, i)
        if not isinstance(r.label, Facts):
            r.label = read(messages[i], r)
        facts.append(r.label)
    tally = tally.plus(facts)
    if seen is not None and len(seen) == n and start < n:
        seen[n - 1].tally = tally
        if start:
            # Moved on, not copied: a tally per turn would keep every turn's set of calls. A
            # request that ends there again (a resend) sums its messages' facts anew.
            seen[start - 1].tally = None
    return tally.vector()
