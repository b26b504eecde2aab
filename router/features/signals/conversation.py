"""Signals read from the recent part of a conversation: tests, exits, errors, loops, failure runs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.features.signals.base import (
    BUILD_ERROR,
    DEFAULT_WEIGHTS,
    EXIT_CODE,
    RUNTIME_ERROR,
    TESTS,
    TOOL_FAILURES,
    TOOL_LOOP,
    Signal,
    Weights,
)
from router.features.signals.text import DEFAULT_MAX_CHARS
from router.features.signals.toolresult import ToolOutcome, analyze, glance
from router.features.signals.transcript import Event, ToolCall, ToolResult, message_events

_Analyzed = tuple[ToolResult, ToolOutcome, ToolCall | None]


@dataclass(slots=True)
class Reading:
    """What one message says, as kept in its memo slot: its tool calls, and its tool results with
    a glance at each; ``label`` is what the outcome label reads of it (``router.learning.labels``),
    filled in later, off the request path."""

    events: list[tuple[Event, ToolOutcome | None]]
    label: Any = None
    #: What the label has summed up over the conversation up to and including this message
    #: (``router.features.labels.features.Tally``), kept by the latest request's last message.
    tally: Any = None


def _tests(results: Sequence[_Analyzed], w: Weights) -> Signal | None:
    for age, (_, out, call) in enumerate(reversed(results)):
        t = out.tests
        if t is not None:
            details = t.as_dict() | {"age": age, "tool": call.name if call else None}
            return Signal(TESTS, t.pass_fraction, t.ok, w.aged(w.tests, age), details)
    return None


def _exit_code(results: Sequence[_Analyzed], w: Weights) -> Signal | None:
    for age, (_, out, call) in enumerate(reversed(results)):
        if out.exit_code is not None:
            # A non-zero exit is weak evidence (grep finding nothing exits 1); zero says nothing.
            success = False if out.exit_code != 0 else None
            details = {"code": out.exit_code, "age": age, "tool": call.name if call else None}
            return Signal(EXIT_CODE, float(out.exit_code), success, w.aged(w.exit_code, age), details)
    return None


def _error(results: Sequence[_Analyzed], w: Weights, name: str, base: float) -> Signal | None:
    """The latest build or runtime error, unless a later result shows things working again."""
    for age, (_, out, call) in enumerate(reversed(results)):
        kind = out.build_error if name == BUILD_ERROR else out.runtime_error
        if kind is not None:
            return Signal(
                name,
                None,
                False,
                w.aged(base, age),
                {"kind": kind, "age": age, "tool": call.name if call else None},
            )
        if out.clean:
            return None
    return None


def _failure_run(results: Sequence[_Analyzed], w: Weights, k: int) -> Signal | None:
    run = 0
    for _, out, _ in reversed(results):
        if not out.failed:
            break
        run += 1
    if run < k or run == 0:
        return None
    tools = [call.name if call else None for _, _, call in results[-run:]]
    return Signal(TOOL_FAILURES, float(run), False, w.tool_failures, {"run": run, "tools": tools})


def _loop(calls: Sequence[ToolCall], results: Sequence[_Analyzed], w: Weights, n: int) -> Signal | None:
    """The strongest of three loop shapes, if any reaches ``n`` repeats.

    Repeating a call is normal (edit, test, edit, test), so a call counts as looping only when it
    repeats back to back or keeps returning the same output; a failure that keeps coming back
    unchanged, whatever the call, is the agent stuck.
    """
    found: list[tuple[int, str, str | None]] = []
    run, best_run, best_call = 0, 0, None
    for i, c in enumerate(calls):
        run = run + 1 if i and c.key == calls[i - 1].key else 1
        if run > best_run:
            best_run, best_call = run, c
    if best_call is not None:
        found.append((best_run, "consecutive_call", best_call.name))
    same = Counter((call.key, out.digest) for _, out, call in results if call is not None)
    if same:
        (key, _), count = same.most_common(1)[0]
        found.append((count, "same_call_same_result", key[0]))
    failing = Counter(out.digest for _, out, _ in results if out.failed)
    if failing:
        digest, count = failing.most_common(1)[0]
        name = next((c.name for _, o, c in reversed(results) if o.digest == digest and c), None)
        found.append((count, "same_failing_result", name))
    count, kind, tool = max(found, default=(0, "", None), key=lambda f: f[0])
    if count < max(n, 2):  # one call is not a loop, whatever the caller asks
        return None
    # Whether the agent is stuck in it still: its latest ``n`` calls or more are one call (``run``
    # ends at the latest call) and their latest results one output (timings masked: the digest),
    # so nothing changed. The label never calls such an attempt a success; the same test run
    # rerun with other results is not stuck. Results pair with calls by order: a text protocol's
    # carry no call id.
    same_out = 0
    for _, out, _ in reversed(results):
        if out.digest != results[-1][1].digest:
            break
        same_out += 1
    ongoing = min(run, same_out) >= max(n, 2)
    details = {"kind": kind, "count": count, "tool": tool, "ongoing": ongoing}
    return Signal(TOOL_LOOP, float(count), False, w.tool_loop, details)


def read(message: Any, max_chars: int | None = DEFAULT_MAX_CHARS) -> Reading:
    return Reading(
        [
            (e, glance(e.text, e.is_error, max_chars=max_chars) if isinstance(e, ToolResult) else None)
            for e in message_events(message)
        ]
    )


def slot(messages: Any, seen: list[Any] | None, i: int, max_chars: int | None = DEFAULT_MAX_CHARS) -> Reading:
    """Message ``i``'s reading: from its slot in ``seen`` if filled (and filling it if not)."""
    if seen is None or len(seen) != len(messages):
        return read(messages[i], max_chars)
    if seen[i] is None:
        seen[i] = read(messages[i], max_chars)
    found: Reading = seen[i]
    return found


#: How many of a request's last messages the signals read.
WINDOW = 20


@dataclass(slots=True)
class Recent:
    """The last messages of a request as the signals read them: their tool calls, and their
    results each with a glance (``recent``). Read once per request: the switch signals before the
    decision, then ``extract`` and the label from the same reading once the request has ended."""

    calls: list[ToolCall]
    results: list[_Analyzed]
    max_chars: int | None = DEFAULT_MAX_CHARS
    _analyzed: list[_Analyzed] | None = None
    _switching: tuple[tuple[Any, ...], tuple[Signal | None, Signal | None]] | None = None

    def analyzed(self) -> list[_Analyzed]:
        """The results fully analysed (build and runtime errors, test summaries)."""
        if self._analyzed is None:
            m = self.max_chars
            self._analyzed = [(e, analyze(e.text, e.is_error, max_chars=m), c) for e, _, c in self.results]
        return self._analyzed

    def switching(
        self, w: Weights, failure_run: int, loop_threshold: int
    ) -> tuple[Signal | None, Signal | None]:
        """A run of failing tools and a tool loop: a glance at each result tells them as well as a
        full analysis does (exit code, error flag, digest)."""
        key = (w, failure_run, loop_threshold)
        if self._switching is None or self._switching[0] != key:
            found = (
                _failure_run(self.results, w, failure_run),
                _loop(self.calls, self.results, w, loop_threshold),
            )
            self._switching = key, found
        return self._switching[1]


def recent(
    messages: Any,
    *,
    window: int = WINDOW,
    max_chars: int | None = DEFAULT_MAX_CHARS,
    seen: list[Any] | None = None,
) -> Recent:
    """The tool calls of the last ``window`` messages and their results (``seen``: as for ``extract``)."""
    if not isinstance(messages, list | tuple) or window <= 0:
        return Recent([], [], max_chars)
    n = len(messages)
    start = max(0, n - window)
    if seen is None or len(seen) != n:
        reads = [read(messages[i], max_chars) for i in range(start, n)]
    else:
        # ``slot`` inline: this runs on every request, for each message of the window.
        reads = seen[start:]
        for k, r in enumerate(reads):
            if r is None:
                reads[k] = seen[start + k] = read(messages[start + k], max_chars)
    pairs = [pair for r in reads for pair in r.events]
    calls = [e for e, _ in pairs if isinstance(e, ToolCall)]
    by_id = {c.call_id: c for c in calls if c.call_id}
    results: list[_Analyzed] = []
    for e, outcome in pairs:
        if isinstance(e, ToolResult) and outcome is not None:
            results.append((e, outcome, by_id.get(e.call_id) if e.call_id else None))
    return Recent(calls, results, max_chars)


def extract(
    protocol: str,
    messages: Any,
    *,
    window: int = WINDOW,
    loop_threshold: int = 3,
    failure_run: int = 3,
    max_chars: int | None = DEFAULT_MAX_CHARS,
    weights: Weights = DEFAULT_WEIGHTS,
    seen: list[Any] | None = None,
    read: Recent | None = None,
) -> list[Signal]:
    """Signals from the last ``window`` messages (Responses: input items) of a request.

    ``protocol`` is "openai_chat", "anthropic" or "openai_responses"; the shapes of all three are
    recognised whatever it says. Each tool result is read up to its last ``max_chars``. Malformed
    input yields fewer signals, never an exception.

    ``seen``, one slot per message (None: not read yet), is for a caller that keeps it between
    the requests of a conversation (``router.features.memo``): what each message of the window says
    is stored in its slot, and a filled slot is used instead of reading the message again. The
    slots must come from calls with the same ``max_chars``. ``read``: the request's ``recent``
    messages as read already (with the same ``window``, ``max_chars`` and ``seen``).
    """
    del protocol  # the shapes identify themselves; kept for the caller's symmetry with fingerprints
    if read is None:
        if not isinstance(messages, list | tuple) or window <= 0:
            return []
        read = recent(messages, window=window, max_chars=max_chars, seen=seen)
    results = read.analyzed()
    found = [
        _tests(results, weights),
        _exit_code(results, weights),
        _error(results, weights, BUILD_ERROR, weights.build_error),
        _error(results, weights, RUNTIME_ERROR, weights.runtime_error),
        *read.switching(weights, failure_run, loop_threshold),
    ]
    return [s for s in found if s is not None]


def switches(
    protocol: str,
    messages: Any,
    *,
    window: int = WINDOW,
    loop_threshold: int = 3,
    failure_run: int = 3,
    max_chars: int | None = DEFAULT_MAX_CHARS,
    weights: Weights = DEFAULT_WEIGHTS,
    seen: list[Any] | None = None,
    read: Recent | None = None,
) -> list[Signal]:
    """The signals of ``extract`` that may move a task off its model: a tool loop, a run of failing
    tools. They need only a glance at each result (exit code, digest), so this is what a routing
    decision waits for; the rest can be read after. Arguments as for ``extract``."""
    del protocol
    if read is None:
        if not isinstance(messages, list | tuple) or window <= 0:
            return []
        read = recent(messages, window=window, max_chars=max_chars, seen=seen)
    if not read.calls and not read.results:
        return []
    return [s for s in read.switching(weights, failure_run, loop_threshold) if s is not None]


def without_tools(seen: list[Any] | None, n_messages: int, window: int = WINDOW) -> bool:
    """Whether the last ``window`` messages hold no tool call or result, as ``switches`` read them
    into ``seen``: then ``extract`` can find nothing. False when that is not known."""
    if seen is None or len(seen) != n_messages:
        return False
    tail = seen[max(0, n_messages - window) :]
    return all(r is not None and not r.events for r in tail)
