"""What the console says: one line per request at ``info``, one per fallback at ``warning``.

The lines are for a person watching ``router serve`` (``--log-format json`` gives machines the
same facts as fields). Prompts, keys and headers never appear; the reason is the decision's, cut
to a few words.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from router.store.records import RequestRecord

log = logging.getLogger("router.requests")

PROTOCOL_NAMES = {"openai_chat": "chat", "anthropic": "messages", "openai_responses": "responses"}
#: Room for a learned plan of three backends with its expected cost and success (about 95
#: characters), the facts its reason is for; at 60 they were what the cut took.
REASON_CHARS = 100


def request_fields(rec: RequestRecord) -> dict[str, Any]:
    """The facts of one finished request, as the JSON log carries them."""
    return {
        "request_id": rec.request_id,
        "protocol": rec.protocol,
        "task_id": rec.task_id,
        "attempt": rec.attempt,
        "requested_model": rec.requested_model,
        "chosen_model": rec.chosen_model,
        "reason": rec.decision_reason,
        "status": rec.status,
        "error_type": rec.error_type,
        "input_tokens": rec.input_tokens,
        "output_tokens": rec.output_tokens,
        "cost_usd": rec.cost_usd,
        "total_ms": rec.total_ms,
        "stream": rec.stream,
    }


def _cut(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1].rstrip() + "…"


def printable(line: str) -> str:
    """``line`` with its control characters escaped (``\\n``, ``\\x1b``): a client names the model
    and its text reaches the line, so a newline in it forged log lines, and an escape sequence
    was written to the operator's terminal."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line)


def request_line(rec: RequestRecord) -> str:
    return printable(_request_line(rec))


def _request_line(rec: RequestRecord) -> str:
    if rec.chosen_model is None and (rec.status or 0) >= 400:
        return refused_line(rec)
    reason = _cut(rec.decision_reason or rec.error_type or "-")
    tokens = f"{rec.input_tokens}/{rec.output_tokens} tok" if rec.input_tokens is not None else "- tok"
    cost = f"${rec.cost_usd:.6f}" if rec.cost_usd is not None else "$-"
    ms = f"{rec.total_ms:.0f} ms" if rec.total_ms is not None else "- ms"
    status = f"{rec.status}" + (f" {rec.error_type}" if rec.error_type else "")
    return (
        f"{PROTOCOL_NAMES.get(rec.protocol or '', rec.protocol)} task {rec.task_id or '-'}: "
        f"{rec.requested_model or '-'} → {rec.chosen_model or '-'} ({reason}) "
        f"{status} {tokens} {cost} {ms}"
    )


def refused_line(rec: RequestRecord) -> str:
    """A request no backend was asked for (bad input, auth, limits, nothing that fits): what was
    refused and why, without the routing fields it never had."""
    what = ", ".join(
        f"{name} {value}" for name, value in (("task", rec.task_id), ("model", rec.requested_model)) if value
    )
    why = f": {_cut(rec.error_message)}" if rec.error_message else ""
    ms = f" {rec.total_ms:.0f} ms" if rec.total_ms is not None else ""
    return (
        f"{PROTOCOL_NAMES.get(rec.protocol or '', rec.protocol or 'request')} refused "
        f"{rec.status} {rec.error_type or 'error'}{why}" + (f" ({what})" if what else "") + ms
    )


def fallback_lines(rec: RequestRecord) -> list[str]:
    """One line per backend the request left for another (its tries, in order)."""
    return [
        f"fallback in request {rec.request_id} (task {rec.task_id or '-'}): {a.model} failed "
        f"({' '.join(str(x) for x in (a.status, a.error_type) if x)}) → {b.model}"
        for a, b in itertools.pairwise(rec.tries or [])
        if a.model != b.model
    ]


def log_request(rec: RequestRecord) -> None:
    """Called once per request, after its reply has gone out."""
    if log.isEnabledFor(logging.WARNING):
        for line in fallback_lines(rec):
            log.warning(line, extra={"event": "fallback", "request_id": rec.request_id})
    if log.isEnabledFor(logging.INFO):
        log.info(request_line(rec), extra={"event": "request", "fields": request_fields(rec)})
