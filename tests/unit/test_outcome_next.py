"""The recommendation that answers a failure (POST /v1/outcomes ``next``) comes from the decider
that decided the task, among the candidates its route allows: the scope in force and the route of
the model the client asked for, as the task's latest logged decision shows them."""

from __future__ import annotations

from pathlib import Path

from router.http.outcomes import deciding
from router.policy.active import load_active_policy
from router.store import RequestRecord
from tests.unit.test_scopes import SCOPES, write


def logged(policy: str, requested: str = "auto", ts: float = 1.0, side_call: bool = False) -> RequestRecord:
    return RequestRecord(f"r{ts}", ts, policy=policy, requested_model=requested, side_call=side_call)


def test_the_scope_and_route_of_the_latest_decision_are_in_force(tmp_path: Path) -> None:
    rt = load_active_policy(write(tmp_path / "p.yaml", SCOPES, routes=[
        {"match": "auto", "candidates": ["cheap", "dear"]}, {"match": "small", "candidates": ["cheap"]}]))  # fmt: skip
    # The acme scope routes auto to dear alone: its recommendation may name no other model.
    decider, models = deciding(rt, "t1", [logged("p/acme/cheapest")])
    assert decider.policy.name == "p/acme" and models == ["dear"]
    # The policy's own route for the model the client asked for.
    decider, models = deciding(rt, "t1", [logged("p/cheapest", "small")])
    assert decider is rt.decider and models == ["cheap"]
    # The latest main-loop decision counts, not a side call's or an older one's.
    rows = [logged("p/cheapest", "small", ts=1.0), logged("p/acme/cheapest", ts=2.0),
            logged("p/cheapest", "small", ts=3.0, side_call=True)]  # fmt: skip
    assert deciding(rt, "t1", rows)[1] == ["dear"]


def test_without_a_logged_decision_every_model_of_the_policy(tmp_path: Path) -> None:
    rt = load_active_policy(write(tmp_path / "p.yaml", SCOPES))
    decider, models = deciding(rt, "t1", [])
    assert decider is rt.decider and models == ["cheap", "dear"]
