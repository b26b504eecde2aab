"""One proxied request on its way: what each stage returned, and the log record made from it.

The stages (auth, parse, the feature pipeline, admission, execution, accounting) return values;
the proxy keeps them in the request's ``Flight`` and, when the request has ended however it
ended, ``record`` assembles the one log row from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

import orjson

from router.errors import AttemptStopped, redact_key
from router.features.task.vector import to_json
from router.forward.accounting import Charge
from router.forward.execute import Execution
from router.policy.active import ActivePolicy
from router.policy.pipeline import Decided
from router.protocols import ClientRequest
from router.shared import Reservation
from router.store.records import RequestRecord
from router.telemetry.phases import Phases


@dataclass(slots=True)
class Flight:
    request_id: str
    ts: float
    protocol: str
    endpoint: str
    client: str | None
    #: The runtime snapshot the request was admitted with, used to its end.
    rt: ActivePolicy
    key_id: str | None = None
    req: ClientRequest | None = None
    #: The prompt as logged, when the operator opted in (taken before any backend saw the body).
    prompt: str | None = None
    task_id: str | None = None
    decided: Decided | None = None
    held: Reservation | None = None
    #: Held on top of ``held`` for tries billed without serving (``Proxy._hold_billed``); settled at 0.
    held_more: list[Reservation] = field(default_factory=list)
    #: Renews the holds while the request runs (``Recorder.holding``), cancelled when it ends.
    renewal: asyncio.Task[None] | None = None
    #: Tokens counted against the key's tokens per minute at admission (its estimate), until
    #: the call has ended and what it used replaces them (``Admission.recount``).
    rate_tokens: int = 0
    execution: Execution | None = None
    charge: Charge | None = None
    status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    #: The router refused the call because it had stopped its attempt: the row names the attempt.
    stopped: AttemptStopped | None = None
    closed: bool = False

    @property
    def stream(self) -> bool:
        return self.req is not None and self.req.stream

    @property
    def model(self) -> str | None:
        """The backend that served (or was tried last); before any try, the one chosen."""
        if self.execution is not None and self.execution.backend is not None:
            return self.execution.backend.id
        return self.decided.decision.chosen if self.decided is not None else None

    def holds(self) -> list[Reservation | None]:
        """Every hold the request has made in the budgets."""
        return [self.held, *self.held_more]

    def ended(self, status: int, error_type: str | None = None, error_message: str | None = None) -> None:
        self.status, self.error_type, self.error_message = status, error_type, error_message


#: The longest string of the client's choosing a log record keeps: longer ones are cut there and
#: marked with "…" (a 1 MiB ``reasoning_effort`` made a 1.77 MB row).
MAX_LOGGED_CHARS = 256


@overload
def capped(text: str) -> str: ...
@overload
def capped(text: None) -> None: ...
def capped(text: str | None) -> str | None:
    return text if text is None or len(text) <= MAX_LOGGED_CHARS else text[:MAX_LOGGED_CHARS] + "…"


@overload
def _unquoted(text: str) -> str: ...
@overload
def _unquoted(text: None) -> None: ...
def _unquoted(text: str | None) -> str | None:
    """A string the client chose, or our error quoting one, without what looks like a key: a client
    that sent its key as the model name had it kept in plain text in the log, the console line and
    the spans (``redact_key``'s patterns: ``sk-``/``rk-`` keys, account ids, Google keys)."""
    return text if text is None else redact_key(text, None)


@overload
def _kept(text: str, secret: Callable[[str], bool]) -> str: ...
@overload
def _kept(text: None, secret: Callable[[str], bool]) -> None: ...
@overload
def _kept(text: str | None, secret: Callable[[str], bool]) -> str | None: ...
def _kept(text: str | None, secret: Callable[[str], bool]) -> str | None:
    """A string of the client's choosing (a header, its user agent) as the log keeps it: cut
    (``capped``), without what looks like a key (``_unquoted``), and nothing of it if it is a
    ``secret`` (the master key, which no pattern finds). Sent as the repository, the user agent or
    a header a rule reads, a key was kept in plain text in the log, the console line and the spans."""
    if text is None:
        return None
    return "[redacted]" if secret(text.strip()) else capped(_unquoted(text))


def prompt_text(req: ClientRequest) -> str:
    return orjson.dumps({"system": req.system, "messages": req.messages}).decode()


def record(f: Flight, phases: Phases, secret: Callable[[str], bool]) -> RequestRecord:
    """The request's log row, from what its stages returned; ``secret``: whether a string is the
    master key (``Auth.is_master``)."""
    rec = RequestRecord(
        request_id=f.request_id, ts=f.ts, protocol=f.protocol, endpoint=f.endpoint,
        client=_kept(f.client, secret),
        key_id=f.key_id, task_id=f.task_id, chosen_model=f.model, status=f.status,
        error_type=f.error_type, error_message=_unquoted(f.error_message), prompt=f.prompt,
    )  # fmt: skip
    for name, value in phases.summary().items():
        setattr(rec, name, value)
    if (req := f.req) is not None:
        rec.requested_model, rec.stream = capped(_unquoted(req.model)), req.stream
        rec.temperature, rec.top_p, rec.max_tokens = req.temperature, req.top_p, req.max_output_tokens
        rec.reasoning_effort, rec.thinking_budget = _kept(req.reasoning_effort, secret), req.thinking_budget
        rec.tools_sha256, rec.system_sha256 = req.tools_sha256(), req.system_sha256()
        rec.n_messages, rec.n_tools = len(req.messages), len(req.tools)
    if (decided := f.decided) is not None:
        task, feats, decision = decided.task, decided.features, decided.decision
        rec.attempt, rec.side_call, rec.p_success = task.attempt, task.side_call, task.p_success
        if task.new_vector and task.vector is not None:
            rec.task_features, rec.repo = to_json(task.vector), _kept(task.repo, secret)
        rec.prompt_tokens_est = feats.prompt_tokens
        rec.policy_revision, rec.arm = f.rt.revision, decided.arm
        logged = f.rt.logged_headers
        if logged:
            rec.rule_headers = {
                h: _kept(v, secret) for h in logged if (v := feats.headers.get(h)) is not None
            }
        rec.decision_id, rec.policy = decision.decision_id, decision.policy
        rec.decision_reason, rec.propensity = decision.reason, decision.propensity
        rec.candidates = list(decision.candidates)
        est = decision.estimate(decision.chosen)
        rec.cost_est_usd = est.cost_usd if est else None
    if (stopped := f.stopped) is not None:  # refused before any decision: its attempt and reading
        rec.attempt, rec.p_success = stopped.attempt, stopped.p_success
    if (ex := f.execution) is not None:
        rec.tries = [t.record(phases.arrival) for t in ex.tries]
        if ex.backend is not None:  # known before the call: a failed request keeps its backend
            rec.backend_model = ex.backend.litellm_model
    if (c := f.charge) is not None:
        u, split = c.usage, c.split
        rec.provider_model, rec.usage_estimated = u.provider_model, c.estimated
        rec.response_id, rec.finish_reasons = u.response_id, u.finish_reasons or None
        rec.input_tokens, rec.output_tokens = u.input_tokens, u.output_tokens
        rec.cache_read_tokens, rec.cache_write_tokens = u.cache_read_tokens, u.cache_write_tokens
        rec.reasoning_tokens = u.reasoning_tokens
        rec.cost_usd, rec.cost_input_usd, rec.cost_output_usd = split.total, split.input, split.output
        rec.cost_cache_read_usd, rec.cost_cache_write_usd = split.cache_read, split.cache_write
        rec.cost_tools_usd = split.tools
    return rec
