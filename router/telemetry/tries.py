"""What one request's tries say: which failures were retried on the same backend, whether it fell back.

``tries`` is the log's column, one dict per try in order: ``model`` (catalog id), ``status`` (the
backend's HTTP status; for a try it never answered, the router's: 502 unreachable, 504 timeout),
``error_type``, ``start_ms`` (arrival → the try's upstream call; None when the try never reached
the backend: its breaker was open, or no concurrency slot came before the deadline) and ``ms``
(the call, to its failure or, for the try that served, to the reply or a stream's first token).

A *retry* is a try on the same backend as the try before it; a *fallback* is a request whose last
try used another backend than an earlier one. A request can have both, or neither with one try.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

Try = Mapping[str, Any]


def retried(tries: Sequence[Try] | None) -> list[Try]:
    """The failed tries that were followed by another try of the same backend."""
    return [t for t, nxt in pairwise(tries or ()) if t.get("model") == nxt.get("model")]


def fallen_back_from(tries: Sequence[Try] | None) -> list[str]:
    """The other backends tried before the last one, in order (empty: no fallback)."""
    if not tries:
        return []
    last = tries[-1].get("model")
    out: list[str] = []
    for t in tries[:-1]:
        model = str(t.get("model"))
        if t.get("model") != last and model not in out:
            out.append(model)
    return out


def reason(t: Try) -> str:
    """Why a try failed, as a bounded label: the error class, else the status."""
    return str(t.get("error_type") or t.get("status") or "unknown")
