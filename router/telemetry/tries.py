"""What one request's tries say: which failures were retried on the same backend, whether it fell back.

``tries`` is the log's column, one ``TryRecord`` per try in order (``router.store.records`` says
what each field holds).

A *retry* is a try on the same backend as the try before it; a *fallback* is a request whose last
try used another backend than an earlier one. A request can have both, or neither with one try.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from router.store.records import TryRecord


def retried(tries: Sequence[TryRecord] | None) -> list[TryRecord]:
    """The failed tries that were followed by another try of the same backend."""
    return [t for t, nxt in pairwise(tries or ()) if t.model == nxt.model]


def fallen_back_from(tries: Sequence[TryRecord] | None) -> list[str]:
    """The other backends tried before the last one, in order (empty: no fallback)."""
    if not tries:
        return []
    last = tries[-1].model
    out: list[str] = []
    for t in tries[:-1]:
        if t.model != last and t.model not in out:
            out.append(t.model)
    return out


def reason(t: TryRecord) -> str:
    """Why a try failed, as a bounded label: the error class, else the status."""
    return str(t.error_type or t.status or "unknown")
