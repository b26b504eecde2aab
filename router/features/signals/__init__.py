"""Implicit task outcomes read from a coding agent's conversation, as weak labels with their source.

``extract`` turns the recent messages of a request into ``Signal``s (test summaries, exit codes,
build and runtime errors, tool-call loops, runs of failing tools); ``summarize`` turns those into
one ``WeakLabel``. An identical request sent again is reported with ``resent_signal`` (the proxy
notices it in its conversation memo, ``router.features.memo``; ``request_fingerprint`` is the same
question as a hash, for callers without one). Everything here is bounded in the text it reads.
"""

from router.features.signals.base import (
    BUILD_ERROR,
    DEFAULT_WEIGHTS,
    EXIT_CODE,
    RESENT,
    RUNTIME_ERROR,
    TESTS,
    TOOL_FAILURES,
    TOOL_LOOP,
    Signal,
    WeakLabel,
    Weights,
    resent_signal,
)
from router.features.signals.conversation import WINDOW, Recent, extract, recent, switches, without_tools
from router.features.signals.fingerprint import request_fingerprint, stable_hash
from router.features.signals.label import summarize
from router.features.signals.testrunners import TestSummary, parse_test_summary
from router.features.signals.toolresult import ToolOutcome, analyze, forget_results, glance
from router.features.signals.transcript import forget_calls


def clear_caches() -> None:
    """Forget the tool results and call arguments read so far (for benchmarks of a cold process)."""
    forget_results()
    forget_calls()


__all__ = [
    "BUILD_ERROR",
    "DEFAULT_WEIGHTS",
    "EXIT_CODE",
    "RESENT",
    "RUNTIME_ERROR",
    "TESTS",
    "TOOL_FAILURES",
    "TOOL_LOOP",
    "WINDOW",
    "Recent",
    "Signal",
    "TestSummary",
    "ToolOutcome",
    "WeakLabel",
    "Weights",
    "analyze",
    "clear_caches",
    "extract",
    "glance",
    "parse_test_summary",
    "recent",
    "request_fingerprint",
    "resent_signal",
    "stable_hash",
    "summarize",
    "switches",
    "without_tools",
]
