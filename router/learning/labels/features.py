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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from router.learning.signals.conversation import Reading, slot
from router.learning.signals.toolresult import test_summary
from router.learning.signals.transcript import CALL_ITEMS, ToolCall, ToolResult

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
_FORMAT_ERRORS: Final = ("Please always provide EXACTLY ONE action",)
_TOO_LONG: Final = ("The output of your last command was too long",)
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
        too_long += any(w in r.text[:1024] for w in _TOO_LONG)
    role = message.get("role")
    step = role == "assistant" or message.get("type") in CALL_ITEMS
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


def unread(seen: list[Any] | None, n_messages: int) -> int:
    """How many of a conversation's messages ``conversation`` would read anew (not in their slots)."""
    if seen is None or len(seen) != n_messages:
        return n_messages
    return sum(1 for r in seen if r is None or not isinstance(r.label, Facts))


def vector(facts: Sequence[Facts]) -> dict[str, float]:
    """The features of a conversation (``NAMES``), from its messages' facts."""
    steps = sum(f.step for f in facts)
    calls = [c for f in facts for c in f.calls]
    results = sum(f.results for f in facts)
    last_tests = next((f.tests for f in reversed(facts) if f.tests is not None), None)
    repeated = len(calls) - len(Counter(calls))
    return {
        "log_chars": math.log1p(sum(f.chars for f in facts)),
        "log_steps": math.log1p(steps),
        "no_tests": float(last_tests is None),
        "tests_failing": float(last_tests is False),
        "repeats": repeated / len(calls) if calls else 0.0,
        "failed_rate": sum(f.failed for f in facts) / results if results else 0.0,
        "format_errors": math.log1p(sum(f.format_error for f in facts)),
        "too_long": math.log1p(sum(f.too_long for f in facts)),
    }
