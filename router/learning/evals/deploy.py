"""The router as it would be deployed on one fold: log → `router train` path → policy → decider.

The training tasks become log records (one logged attempt per task × model, with an explicit
outcome and the run's real cost), which go through ``dataset.build`` and ``fit`` exactly as
``router train`` reads a log. The artifact is written, pinned by sha256 in a policy built from
``models.csv``, read back once (as the router reads it, the pin checked) and scored by
``runtime.scorer_for`` — the loader the proxy uses — for each objective, so every choice in the
replay is ``Decider.decide`` on the features of the task's first request.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from router.features.task.vector import to_json
from router.learning.evals.arrival import REQUESTED_MODEL, Arrival
from router.learning.evals.loader import Dataset, Model
from router.learning.training import dataset
from router.learning.training.fit import fit
from router.policy.active import scorer_for
from router.policy.artifact import Artifact
from router.policy.catalog import Catalog, build_catalog
from router.policy.config import Policy, PolicyFile
from router.policy.decide import Decider, Scorer
from router.policy.learned import LearnedScorer
from router.store.records import Estimate, OutcomeRecord, RequestRecord

#: Windows large enough that no SWE-bench opening request is excluded on size.
CONTEXT_WINDOW = 1_000_000
MAX_OUTPUT = 64_000


@dataclasses.dataclass(frozen=True, slots=True)
class Knobs:
    """The objective block of the policy file."""

    max_attempts: int = 1
    #: USD per completed task (None: each task's least cost per completed task).
    value: float | None = None
    #: A fleet-wide share of tasks to complete (instead of a value).
    target_success: float | None = None
    max_cost_per_task: float | None = None


def policy_for(
    models: Sequence[Model], knobs: Knobs, *, artifact: Path | None = None, sha256: str | None = None,
    source: str = "(router eval)",
) -> Policy:  # fmt: skip
    """A policy with one route (``auto``) whose candidates are all the models, validated as a file is."""
    raw: dict[str, Any] = {
        "name": "eval",
        "models": [
            {
                "id": m.id,
                "litellm_model": f"openai/{m.id}",
                "protocol": "openai",
                "context_window": CONTEXT_WINDOW,
                "max_output_tokens": MAX_OUTPUT,
                "prices": {
                    "input": m.usd_per_m_input,
                    "output": m.usd_per_m_output,
                    "cache_read": m.usd_per_m_cached_input
                    if m.usd_per_m_cached_input is not None
                    else m.usd_per_m_input,
                },
            }
            for m in models
        ],
        "routes": [{"match": REQUESTED_MODEL, "candidates": [m.id for m in models]}],
        "objective": {
            "max_attempts": knobs.max_attempts,
            "value_per_completed_usd": knobs.value,
            "target_success": knobs.target_success,
            "max_cost_per_task": knobs.max_cost_per_task,
        },
    }
    if artifact is not None and sha256 is not None:
        raw["learned"] = {"artifact": str(artifact), "sha256": sha256}
    return Policy(PolicyFile.model_validate(raw), source)


def catalog_for(policy: Policy) -> Catalog:
    # Every price and window is given, so litellm's price map is never consulted.
    return build_catalog(policy, lookup=lambda _model: None)


def log_records(
    data: Dataset, task_ids: Sequence[str], arrivals: Mapping[str, Arrival]
) -> tuple[list[RequestRecord], list[OutcomeRecord]]:
    """The training tasks as the log would hold them under a uniform logging policy.

    The data has one independent run per task × model, so each run is logged as the first
    attempt of its own task session, chosen with propensity 1/len(models).
    """
    models = data.model_ids
    # Every model was a candidate (training reads which, not what the decision estimated of them).
    candidates = [Estimate(m, 0, 0, 0, 0.0) for m in models]
    requests: list[RequestRecord] = []
    outcomes: list[OutcomeRecord] = []
    ts = 1_700_000_000.0
    for tid in task_ids:
        vec = to_json(arrivals[tid].vector)
        for m in models:
            o = data.outcome(tid, m)
            ts += 1.0
            session = f"{tid}#{m}"
            rec = RequestRecord(
                request_id=f"{session}#1", ts=ts, task_id=session, attempt=1, protocol="openai_chat",
                requested_model=REQUESTED_MODEL, chosen_model=m, status=200, cost_usd=o.cost,
                propensity=1.0 / len(models), candidates=candidates, task_features=vec,
            )  # fmt: skip
            requests.append(rec)
            out = OutcomeRecord(task_id=session, attempt=1, success=o.resolved, score=None,
                                source="explicit", details=None, ts=ts + 0.5, explicit=True)  # fmt: skip
            outcomes.append(out)
    return requests, outcomes


def train(
    data: Dataset, task_ids: Sequence[str], arrivals: Mapping[str, Arrival], max_attempts: int = 1, *,
    target: float | None = None, noise: tuple[float, float] = (0.0, 0.0),
) -> Artifact:  # fmt: skip
    """The artifact ``router train`` would write from these tasks' log (its prior plans chosen
    under the verifier ``noise`` the policy will learn outcomes through)."""
    requests, outcomes = log_records(data, task_ids, arrivals)
    rows = dataset.build(requests, outcomes, now=float("inf"))
    return fit(rows, max_attempts=max_attempts, target=target, noise=noise)


class Deployment:
    """One trained artifact on disk, and deciders built from it for any objective knobs."""

    def __init__(self, data: Dataset, artifact: Artifact, workdir: Path) -> None:
        self.models = data.models
        self.path = workdir / "learned.json"
        raw = artifact.to_json()
        self.path.write_bytes(raw)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.workdir = workdir
        # Read back once as the router would (what it scores is what was written); every decider
        # of this deployment shares it, as one router's scorers do.
        self.artifact = Artifact.load(self.path, self.sha256)

    def decider(self, knobs: Knobs) -> Decider:
        policy = policy_for(self.models, knobs, artifact=self.path, sha256=self.sha256,
                            source=str(self.workdir / "policy.yaml"))  # fmt: skip
        scorer: Scorer | None = scorer_for(policy, self.artifact)
        if scorer is None:  # pragma: no cover - the policy always pins the artifact
            raise RuntimeError("the evaluation policy lost its learned block")
        return Decider(policy, catalog_for(policy), scorer)


def price_decider(models: Sequence[Model]) -> Decider:
    """The router without a learned artifact: cheapest expected call cost first."""
    policy = policy_for(models, Knobs())
    return Decider(policy, catalog_for(policy))


class Router:
    """Stops when the policy recommends it (``LearnedScorer.recommend``, as ``POST /v1/outcomes``
    answers a failure), else chooses the model of the attempt with ``Decider.decide``, as the proxy
    does at an attempt's start."""

    def __init__(self, decider: Decider, arrivals: Mapping[str, Arrival], budget: float | None) -> None:
        self.decider = decider
        self.arrivals = arrivals
        self.budget = budget
        self.models = list(decider.policy.models)
        scorer = decider.scorer
        self.scorer = scorer if isinstance(scorer, LearnedScorer) else None

    def __call__(self, task_id: str, attempt: int, failed: tuple[str, ...], spent: float) -> str | None:
        base = self.arrivals[task_id].features
        vec = self.arrivals[task_id].vector
        budget = None if self.budget is None else max(self.budget - spent, 0.0)
        if self.scorer is not None:
            advice = self.scorer.recommend(vec, self.models, attempt=attempt, failed=failed, budget=budget)
            if not advice.retry:
                return None
        features = dataclasses.replace(
            base, task_vector=vec, attempt=attempt, failed_models=failed, pinned=None, task_budget_left=budget
        )
        return self.decider.decide(features).chosen
