"""What comes after an attempt: the model the task's next attempt goes to, or that none is planned.

One answer for the two places that say it: ``POST /v1/outcomes`` answering a failure (``next``) and
the error that ends an attempt the router stopped (``AttemptStopped``). With a learned policy it is
the task's plan (``LearnedScorer.recommend``: remembered per task and attempt, so both read the same
plan); without one, the model the decider would serve the next attempt's first call (the models
that failed the task go last), with no success or cost to expect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from router.errors import RouterError
from router.features.request import Features
from router.policy.decide import Decider
from router.policy.learned import LearnedScorer


def planned(
    decider: Decider, models: Sequence[str], vec: Mapping[int, float] | None, attempt: int,
    failed: Sequence[str],
) -> dict[str, Any] | None:  # fmt: skip
    """After attempt ``attempt`` failed (``failed``: the models that failed the task so far), what the
    learned plan says of the next one, as the outcome reply's ``next``; None without a learned
    policy or the task's features. ``models``: the models the task's route allows."""
    scorer = decider.scorer
    if vec is None or not isinstance(scorer, LearnedScorer):
        return None
    known = [m for m in models if m in scorer.artifact.models]
    return scorer.recommend(vec, known, attempt=attempt + 1, failed=failed).as_dict()


def after_stop(decider: Decider, features: Features) -> dict[str, Any]:
    """What comes after the attempt the router stopped on ``features.pinned``, for a request of it."""
    failed = list(features.failed_models)
    if features.pinned is not None and features.pinned not in failed:
        failed.append(features.pinned)
    route = decider.policy.route_for(features.requested_model)
    models = [] if route is None else route.chosen_among
    learned = planned(decider, models, features.task_vector, features.attempt, failed)
    if learned is not None:
        return learned
    # No plan: the decider's own choice for the next attempt's first call, this request's shape.
    nxt = replace(
        features, attempt=features.attempt + 1, failed_models=tuple(failed), pinned=None,
        switch_reason=None, signed_history=None, warm_model=None, warm_tokens=0, warm_cached=None,
    )  # fmt: skip
    try:
        model: str | None = decider.decide(nxt, explore=False).chosen
    except RouterError:  # nothing could serve it (the budget, a window)
        model = None
    return {"retry": model is not None, "model": model, "expected_success": None, "expected_cost_usd": None}


def told(why: str, nxt: Mapping[str, Any]) -> str:
    """The stopped attempt's message: why it stopped (``attempt.message``), and what comes next."""
    model, odds = nxt.get("model"), nxt.get("expected_success")
    if nxt.get("retry") and model:
        plan = (
            ""
            if odds is None
            else f" (the plan from there: {odds:.0%} success for ${nxt['expected_cost_usd']:.4f})"
        )
        return f"{why}; start the task again: its next attempt goes to {model}{plan}"
    if odds is None:  # no plan, and the decider found no model for another attempt
        return f"{why}; no further attempt is planned: no model the route allows can serve one"
    return (
        f"{why}; no further attempt is planned: the policy expects another to be worth less than it "
        "costs (one started anyway is served on the best plan left)"
    )
