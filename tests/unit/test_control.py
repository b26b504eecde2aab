"""The control arm: stable assignment by task, the reference policy, and per-arm statistics."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.errors import ConfigError
from router.policy.active import load_active_policy
from router.policy.control import CONTROL, TREATED, arm_of
from router.rollout.arms import arm_report, by_arm, ratio_of_means, wilson
from router.store import OutcomeRecord, RequestRecord

M = {"litellm_model": "openai/x", "protocol": "openai", "prices": {"input": 1, "output": 2},
     "context_window": 100_000, "max_output_tokens": 1000}  # fmt: skip


def write(path: Path, **extra: Any) -> Path:
    doc = {"version": 1, "name": path.stem, "models": [{**M, "id": "cheap"}, {**M, "id": "dear", "prices": {"input": 9, "output": 9}}],
           "routes": [{"match": "auto", "candidates": ["cheap", "dear"]}], **extra}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


def test_arms_are_stable_per_task_and_nested_as_the_share_grows() -> None:
    ids = [f"task-{i}" for i in range(20_000)]
    small = {t for t in ids if arm_of(t, 0.05) == CONTROL}
    large = {t for t in ids if arm_of(t, 0.10) == CONTROL}
    assert small <= large  # raising the share only moves tasks into control
    assert abs(len(small) / len(ids) - 0.05) < 0.006 and abs(len(large) / len(ids) - 0.10) < 0.008
    assert all(arm_of(t, 0.05) == CONTROL for t in small)  # the same answer every time
    assert arm_of(None, 0.99) == TREATED


def test_a_control_route_decides_its_share_of_tasks(tmp_path: Path) -> None:
    rt = load_active_policy(
        write(tmp_path / "p.yaml", control={"share": 0.5, "route": {"passthrough": "dear"}})
    )
    assert rt.control is not None and rt.control.reference == "route"
    control_task = next(f"t{i}" for i in range(100) if arm_of(f"t{i}", 0.5) == CONTROL)
    treated_task = next(f"t{i}" for i in range(100) if arm_of(f"t{i}", 0.5) == TREATED)
    arm, decider = rt.arm_for(control_task)
    assert arm == CONTROL and decider.policy.name == "p/control" and decider.epsilon == 0
    assert rt.arm_for(treated_task) == (TREATED, rt.decider)
    plain = load_active_policy(write(tmp_path / "q.yaml"))
    assert plain.arm_for("t1") == (None, plain.decider)


def test_a_control_policy_file_is_part_of_the_revision(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref.yaml", routes=[{"match": "auto", "passthrough": "dear"}])
    path = write(tmp_path / "p.yaml", control={"share": 0.1, "policy": "ref.yaml"})
    first = load_active_policy(path)
    assert first.control is not None and first.control.reference == str(ref.resolve())
    write(tmp_path / "ref.yaml", routes=[{"match": "auto", "passthrough": "cheap"}])
    assert load_active_policy(path).revision != first.revision


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"control": {"share": 0.1}}, "control: give exactly one of policy or route"),
        ({"control": {"share": 1.5, "route": {"passthrough": "cheap"}}}, "control.share"),
        (
            {"control": {"share": 0.1, "route": {"passthrough": "gone"}}},
            "control.route: routes[0] (match 'auto').passthrough: unknown model id 'gone'",
        ),
        (
            {"control": {"share": 0.1, "route": {"passthrough": "cheap"}, "extra": 1}},
            "control.extra: unknown field",
        ),
        ({"guard": {"min_tasks": 50}}, "guard: needs a control arm"),
        # A file the policy names that is not there: the message named the file alone, not the
        # policy nor the line that names it.
        ({"control": {"share": 0.1, "policy": "missing.yaml"}},
         "{tmp}/p.yaml: control.policy: {tmp}/missing.yaml: cannot read control policy: No such file or directory"),
        ({"learned": {"artifact": "gone.json", "sha256": "0" * 64}},
         "{tmp}/p.yaml: learned.artifact: {tmp}/gone.json: cannot read learned artifact: No such file or directory "
         "(`router train --out FILE` writes one and `router promote FILE --config {tmp}/p.yaml` pins it; or remove "
         "the learned: section)"),
    ],
)  # fmt: skip
def test_bad_control_and_guard_sections_name_the_field(
    tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_active_policy(write(tmp_path / "p.yaml", **extra))
    assert message.format(tmp=tmp_path) in str(err.value)


def test_a_reference_policy_may_only_use_models_of_the_catalog(tmp_path: Path) -> None:
    other = {**M, "id": "elsewhere"}
    (tmp_path / "ref.yaml").write_text(yaml.safe_dump({"version": 1, "models": [other],
                                                        "routes": [{"match": "auto", "passthrough": "elsewhere"}]}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"models of .*ref\.yaml not in this file's catalog: elsewhere"):
        load_active_policy(write(tmp_path / "p.yaml", control={"share": 0.1, "policy": "ref.yaml"}))


def test_wilson_and_the_delta_method() -> None:
    lo, hi = wilson(8, 10)  # type: ignore[misc]
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)  # the textbook values for 8/10
    assert wilson(0, 0) is None
    # Cost 2 on every task, half of them completed: $4 per completed task.
    r, var = ratio_of_means([2.0] * 100, [1.0, 0.0] * 50)  # type: ignore[misc]
    assert r == pytest.approx(4.0)
    # d(mean c / mean s) with c constant: only the success rate's variance counts.
    assert math.sqrt(var) == pytest.approx(4.0 * math.sqrt(0.25 * 100 / 99 / 100) / 0.5, rel=1e-6)


def test_per_arm_summary_from_log_rows() -> None:
    reqs = [RequestRecord(f"r{i}", 1.0, task_id=f"t{i}", arm="control" if i < 4 else "treated",
                          policy_revision="r1", cost_usd=0.01 * (i + 1), status=200, total_ms=100.0 + i)
            for i in range(10)]  # fmt: skip
    reqs.append(RequestRecord("r0b", 1.0, task_id="t0", arm="control", policy_revision="r1", cost_usd=0.01,
                              status=200, total_ms=50.0))  # fmt: skip
    outs = [OutcomeRecord(f"t{i}", 1, i % 2 == 0, None, "explicit", None, 1.0, True) for i in range(9)]
    arms = by_arm(reqs, outs, "r1")
    assert (arms["control"].tasks, arms["control"].n, sum(arms["control"].success)) == (4, 4, 2.0)
    assert arms["control"].cost[0] == pytest.approx(0.02)  # both requests of t0
    assert (arms["treated"].tasks, arms["treated"].n) == (6, 5)  # t9 has no verdict yet
    report = arm_report(reqs, outs)
    control = report["revisions"][0]["arms"]["control"]
    assert control["success_rate"] == 0.5 and control["cost_per_completed_usd"] == pytest.approx(
        (0.02 + 0.02 + 0.03 + 0.04) / 2
    )
    assert control["latency_ms"]["requests"] == 5


def test_a_tally_counts_each_request_once_across_overlapping_reads() -> None:
    from router.rollout.arms import TaskTally

    rows = [RequestRecord(f"r{i}", float(i), task_id=f"t{i % 3}", arm="treated", policy_revision="r1",
                          cost_usd=1.0) for i in range(6)]  # fmt: skip
    tally = TaskTally("r1", latency=False)
    tally.add(rows[:4])
    tally.add(rows[2:])  # the overlap is read again
    assert dict(tally.cost) == {"t0": 2.0, "t1": 2.0, "t2": 2.0}
    tally.forget_before(4.0)
    assert set(tally.seen) == {"r4", "r5"}
    tally.add([replace(rows[0], policy_revision="r2", request_id="x")])  # another revision's row
    assert sum(tally.cost.values()) == 6.0


def test_a_label_counts_its_confidence_an_explicit_outcome_counts_whole() -> None:
    from router.rollout.arms import success_value

    def verdict(success: bool, explicit: bool, source: str, score: float) -> OutcomeRecord:
        return OutcomeRecord("t", 1, success, score, source, None, 1.0, explicit)

    assert success_value(verdict(True, True, "explicit", 0.2)) == 1.0
    assert success_value(verdict(True, False, "outcome_model", 0.8)) == 0.8
    assert success_value(verdict(False, False, "outcome_model", 0.3)) == 0.3
    assert success_value(verdict(True, False, "tests", 0.5)) == 1.0
    reqs = [RequestRecord("r", 1.0, task_id="t", attempt=1, arm="treated", cost_usd=1.0, status=200)]
    outs = [verdict(True, False, "outcome_model", 0.75)]
    assert by_arm(reqs, outs)["treated"].success == [0.75]
