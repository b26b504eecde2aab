"""The rows of the router's log: one ``RequestRecord`` per client request, ``OutcomeRecord`` per verdict.

The field names are the column names; ``router.store.schema`` derives the tables from these
classes, so adding a field adds a column. A field added after the first release needs
``metadata={"since": N}`` (N = the schema version that adds it) so existing databases get an
``ALTER TABLE``; opening a store refuses to start if a field has no column. ``KeyRecord`` is a
virtual key (its hash and limits, never the key). The JSON columns ``candidates`` and ``tries``
hold records too (``Estimate``, ``TryRecord``), written as ``as_json`` says and read back as records
(``router.store.rows``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final


class StoreDataError(Exception):
    """The store refused a record's *contents* (the store is fine): retrying the same rows fails again."""


@dataclass(slots=True)
class Estimate:
    """What the decision estimated of one candidate backend (``router.policy.decide``): what
    ``/v1/route`` answers, and what the log keeps in ``candidates``."""

    model: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
    excluded: str | None = None
    score: float | None = None
    p_success: float | None = None
    attempt_cost_usd: float | None = None
    cost_per_completed_usd: float | None = None
    #: What a budget holds for this call: the cost at a high quantile of its output.
    hold_usd: float | None = None
    #: What the call may cost at most: its whole output (the client's limit, else the backend's)
    #: and the most calls of each hosted tool it declares; a key's budget holds up to this much.
    worst_usd: float | None = None
    #: The output table's cell of the call (``turn_cell``), the warm prefix's whole cache blocks
    #: on this backend (``cached_tokens`` is the learned share of them) and the cache table's cell
    #: (``cache_cell``): logged for ``router train``.
    output_cell: str | None = None
    cacheable_tokens: int | None = None
    cache_cell: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The fields that are set (None ones are left out of the log and of ``/v1/route``)."""
        # By hand: dataclasses.asdict deep-copies, and this runs for every candidate of every request.
        return {k: v for k in _ESTIMATE_FIELDS if (v := getattr(self, k)) is not None}


_ESTIMATE_FIELDS: Final = tuple(f.name for f in fields(Estimate))


@dataclass(frozen=True, slots=True)
class TryRecord:
    """One try of a request, in order (``router.telemetry.tries`` reads them)."""

    #: The catalog id of the backend tried.
    model: str
    #: Arrival → the try's upstream call (None: the try never reached the backend, its breaker was
    #: open or no concurrency slot came before the deadline).
    start_ms: float | None = None
    #: The call, to its failure or, for the try that served, to the reply or a stream's first token.
    ms: float | None = None
    #: The backend's HTTP status; for a try it never answered, the router's (502 unreachable, 504 timeout).
    status: int | None = None
    error_type: str | None = None
    #: What a failed try was billed: as its provider reported it, or estimated for a try the
    #: router gave up on by a timeout (``router.forward.accounting.given_up``); part of the
    #: request's ``cost_usd``.
    cost_usd: float | None = None

    def as_json(self) -> dict[str, Any]:
        """Every field, None ones as null (the log's documented form), ``cost_usd`` only when set."""
        out = {"model": self.model, "start_ms": self.start_ms, "ms": self.ms, "status": self.status,
               "error_type": self.error_type}  # fmt: skip
        if self.cost_usd is not None:
            out["cost_usd"] = self.cost_usd
        return out


@dataclass(slots=True)
class RequestRecord:
    """Everything the router knows about one client request, written once when it ends."""

    request_id: str
    ts: float  # unix seconds at arrival
    decision_id: str | None = None
    task_id: str | None = None
    attempt: int | None = None
    side_call: bool = False

    protocol: str | None = None  # "openai_chat" | "anthropic" | "openai_responses"
    endpoint: str | None = None
    client: str | None = None  # user-agent product token, at most 64 chars

    requested_model: str | None = None
    chosen_model: str | None = None  # catalog id that served, or the last one that failed
    backend_model: str | None = None  # litellm model string
    provider_model: str | None = None  # what the provider reported in its response
    response_id: str | None = field(default=None, metadata={"since": 6})  # the provider's id of its reply
    #: Why the reply ended, as the provider said (OpenAI finish_reason, Anthropic stop_reason, ...).
    finish_reasons: list[str] | None = field(default=None, metadata={"since": 6})

    policy: str | None = None
    decision_reason: str | None = None
    propensity: float | None = None
    candidates: list[Estimate] | None = None
    tries: list[TryRecord] | None = None

    stream: bool = False
    status: int | None = None  # HTTP status the client got
    error_type: str | None = None
    error_message: str | None = None

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    usage_estimated: bool = False
    prompt_tokens_est: int | None = None
    cost_usd: float | None = None
    cost_est_usd: float | None = None
    # cost_usd split by what was paid for, at the prices of the request's time (prices change later).
    cost_input_usd: float | None = field(default=None, metadata={"since": 2})  # uncached input
    cost_output_usd: float | None = field(default=None, metadata={"since": 2})
    cost_cache_read_usd: float | None = field(default=None, metadata={"since": 2})
    cost_cache_write_usd: float | None = field(default=None, metadata={"since": 2})

    queue_ms: float | None = None
    #: The first try's upstream call → the last try's: failed tries and the back-off between them.
    retry_ms: float | None = field(default=None, metadata={"since": 6})
    ttft_ms: float | None = None
    decode_ms: float | None = None
    gap_mean_ms: float | None = None
    gap_p95_ms: float | None = None
    gap_max_ms: float | None = None
    delivery_ms: float | None = None
    total_ms: float | None = None

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    tools_sha256: str | None = None
    system_sha256: str | None = None
    n_messages: int | None = None
    n_tools: int | None = None

    prompt: str | None = None  # only when the operator opts in to prompt logging
    # The task's feature vector (hashed, no text), on the first main-loop request of each task.
    task_features: dict[str, float] | None = field(default=None, metadata={"since": 2})
    #: The virtual key that made the request (its id, never the key); None in open mode or for the master key.
    key_id: str | None = field(default=None, metadata={"since": 3})
    #: The policy revision in force when the request was decided (``router.policy.revisions``).
    policy_revision: str | None = field(default=None, metadata={"since": 5})
    #: "control" when the task was assigned to the policy's control arm, else "treated".
    arm: str | None = field(default=None, metadata={"since": 5})
    #: The request headers the policy's rules read (``headers.<name>``), so a preview can replay them.
    rule_headers: dict[str, str] | None = field(default=None, metadata={"since": 5})
    #: The task's repository (``x-router-repo``, else a github.com URL in the opening message), on
    #: the task's first main-loop request, as ``task_features``.
    repo: str | None = field(default=None, metadata={"since": 7})
    #: The label model's P(success | the conversation so far) that the stop-loss read at this call
    #: (the attempt's latest label, read off the request path after an earlier call of it); None
    #: without one (a side call, an attempt's first calls, a conversation without tools). ``router
    #: train`` learns each model's stop-loss from these readings and the attempts' outcomes.
    p_success: float | None = field(default=None, metadata={"since": 9})
    #: Part of ``cost_usd``: the hosted tools' calls (web searches, ...), billed per call on top of tokens.
    cost_tools_usd: float | None = field(default=None, metadata={"since": 10})

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The log's column names, in table order."""
        return tuple(f.name for f in fields(cls))


@dataclass(slots=True)
class OutcomeRecord:
    """A verdict on one attempt at a task: explicit client feedback, or an inferred signal."""

    task_id: str
    attempt: int | None  # stored as 0 when unknown (it is part of the primary key)
    success: bool
    score: float | None
    source: str  # "explicit" or the signal's name
    details: dict[str, Any] | None
    ts: float
    explicit: bool

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The outcome table's column names, in table order."""
        return tuple(f.name for f in fields(cls))


@dataclass(slots=True)
class KeyRecord:
    """A virtual key: only its SHA-256 is kept; the key itself is shown once, at creation."""

    key_id: str  # non-secret handle, used in the log and by ``router keys revoke``
    key_hash: str  # hex SHA-256 of the whole key
    prefix: str  # the key's first characters, for telling keys apart in listings
    name: str
    created_at: float
    budget_usd: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    models: list[str] | None = None  # requested-model names or globs this key may use; None = any
    revoked_at: float | None = None
    # The team whose scopes apply to the key's requests: a key's caller cannot choose it (a client
    # header could pick a scope that routes wider or spends more than the key's own).
    team: str | None = field(default=None, metadata={"since": 8})

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
