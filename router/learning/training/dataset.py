"""The log as a training set: one row per task attempt, with its model, outcome and cost.

An attempt's label is its explicit outcome when the client sent one; else the label inferred
from the conversation (the label model's, ``router.features.labels``, before older hand-weighted
ones), unless the attempt's latest main-loop request went unanswered (the router refused it: a
budget, a stopped attempt, a rate limit; or no backend answered): it did not end by the agent's
doing, whatever the conversation read like before (``router.telemetry.ledger.credible``); else,
for an attempt with no request for ``abandon_after_s``, a failure marked "abandoned"; attempts
still in progress are left out.

Each row carries how much its label counts: an explicit outcome 1; the label model's its
evidence margin |2P − 1| (below 1, so explicit outcomes always dominate); any other inferred
label ``INFERRED_WEIGHT``.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from router.features.labels.model import SOURCE as MODEL_SOURCE
from router.features.task.vector import Vector, from_json, with_attempt
from router.policy.scopes import ScopeFacts, logged_facts
from router.store import OutcomeRecord, RequestRecord
from router.telemetry.ledger import ended_answered

#: The weight of an inferred label that carries no calibrated probability (older hand-weighted
#: signals, an abandoned attempt): they agreed with real verdicts little better than chance.
INFERRED_WEIGHT = 0.5
#: The label source of an attempt whose outcome the client reported.
EXPLICIT = "explicit"


@dataclass(slots=True)
class AttemptRow:
    task_id: str
    attempt: int
    model: str
    vector: Vector
    success: bool
    label_source: str
    cost: float
    n_calls: int
    #: Probability the logging policy gave to ``model`` for this attempt's first main-loop call.
    propensity: float
    #: The models the logging policy could have chosen (eligible candidates of that call).
    actions: list[str]
    failed_before: list[str] = field(default_factory=list)
    ts: float = 0.0
    #: How much the label counts in training (1 for an explicit outcome).
    weight: float = 1.0
    #: What scopes match on (``router.policy.scopes``), as the attempt's first main-loop call logged it.
    facts: ScopeFacts = field(default_factory=ScopeFacts)


def label_weight(outcome: OutcomeRecord) -> float:
    """How much one stored outcome counts as a training label."""
    if outcome.explicit:
        return 1.0
    if outcome.source == MODEL_SOURCE and outcome.score is not None:
        return round(abs(2 * outcome.score - 1), 6)
    return INFERRED_WEIGHT


def _label(outcomes: list[OutcomeRecord]) -> tuple[bool, str, float] | None:
    explicit = [o for o in outcomes if o.explicit]
    if explicit:
        o = max(explicit, key=lambda o: o.ts)
        return o.success, EXPLICIT, 1.0
    if not outcomes:
        return None
    model = [o for o in outcomes if o.source == MODEL_SOURCE]
    tests = [o for o in outcomes if o.source == "tests"]
    o = max(model or tests or outcomes, key=lambda o: o.ts)
    return o.success, o.source, label_weight(o)


def build(
    requests: Iterable[RequestRecord],
    outcomes: Iterable[OutcomeRecord],
    *,
    abandon_after_s: float = 1800,
    now: float | None = None,
) -> list[AttemptRow]:
    now = time.time() if now is None else now
    by_attempt: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    vectors: dict[str, Vector] = {}
    repos: dict[str, str] = {}
    for r in requests:
        task = r.task_id
        if not task:
            continue
        if r.task_features and task not in vectors:
            vectors[task] = from_json(r.task_features)
        if r.repo and task not in repos:
            repos[task] = r.repo
        by_attempt[(task, r.attempt or 1)].append(r)
    labels: dict[tuple[str, int], list[OutcomeRecord]] = defaultdict(list)
    for o in outcomes:
        labels[(o.task_id, o.attempt or 0)].append(o)

    rows: list[AttemptRow] = []
    for (task, attempt), reqs in sorted(by_attempt.items(), key=lambda kv: kv[1][0].ts):
        if task not in vectors:
            continue
        served = [(r, r.chosen_model) for r in reqs if not r.side_call and r.status == 200 and r.chosen_model]
        if not served:
            continue
        main = [r for r, _ in served]
        found = labels.get((task, attempt), []) or labels.get((task, 0), [])
        if not ended_answered(reqs):
            found = [o for o in found if o.explicit]
        label = _label(found)
        if label is None:
            if now - max(r.ts for r in reqs) < abandon_after_s:
                continue  # still in progress
            label = (False, "abandoned", INFERRED_WEIGHT)
        model = Counter(m for _, m in served).most_common(1)[0][0]
        first = main[0]
        actions = [c.model for c in (first.candidates or []) if not c.excluded] or [model]
        rows.append(
            AttemptRow(
                task_id=task,
                attempt=attempt,
                model=model,
                vector=with_attempt(vectors[task], attempt),
                success=label[0],
                label_source=label[1],
                cost=sum(r.cost_usd or 0.0 for r in reqs),
                n_calls=len(main),
                propensity=first.propensity or 1.0,
                actions=actions,
                ts=first.ts,
                weight=label[2],
                facts=logged_facts(first, repos.get(task)),
            )
        )
    failed: dict[str, list[str]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r.task_id, r.attempt)):
        row.failed_before = list(failed[row.task_id])
        if not row.success:
            failed[row.task_id].append(row.model)
    return rows
