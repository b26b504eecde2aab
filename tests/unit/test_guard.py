"""The guard's sequential test: decisions on clear cases, and its false-alarm rate under repeated looks."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from pathlib import Path

import pytest
import yaml

from router.policy.active import PolicyHistory, load_active_policy
from router.policy.config import GuardSpec
from router.policy.revisions import Archive
from router.rollout.arms import ArmTasks
from router.rollout.guard import Guard, Verdict, judge, msprt
from router.rollout.rollback import rollback
from router.store.records import OutcomeRecord, RequestRecord
from router.store.sqlite import SQLiteStore

SPEC = GuardSpec(max_success_drop=0.03, max_cost_per_completed_increase=0.10, min_tasks=50, alpha=0.05)


def arm(successes: list[bool], cost: float | list[float] = 1.0) -> ArmTasks:
    costs = cost if isinstance(cost, list) else [cost] * len(successes)
    return ArmTasks(tasks=len(successes), success=[1.0 if s else 0.0 for s in successes], cost=costs)


def bernoulli(rng: random.Random, p: float, n: int) -> list[bool]:
    return [rng.random() < p for _ in range(n)]


def test_the_mixture_ratio() -> None:
    assert msprt(0.0, 0.01, 0.0009) < 1  # no evidence: below 1
    assert msprt(0.2, 0.001, 0.0009) > msprt(0.1, 0.001, 0.0009) > 1  # grows with the effect
    v, t2, d = 0.002, 0.0009, 0.05
    assert msprt(d, v, t2) == math.sqrt(v / (v + t2)) * math.exp(t2 * d * d / (2 * v * (v + t2)))


def test_no_decision_before_min_tasks_in_each_arm() -> None:
    v = judge(arm([True] * 49), arm([False] * 500), SPEC)
    assert not v.worse and v.reason.startswith("waiting: 49 control")


def test_a_clearly_worse_success_rate_rolls_back() -> None:
    rng = random.Random(1)
    v = judge(arm(bernoulli(rng, 0.8, 300)), arm(bernoulli(rng, 0.5, 300)), SPEC)
    assert v.worse and v.reason.startswith("success") and v.success_lr is not None and v.success_lr >= 40


def test_all_failures_against_all_successes_still_has_a_variance() -> None:
    v = judge(arm([True] * 60), arm([False] * 60), SPEC)
    assert v.worse and math.isfinite(v.success_lr or math.inf)


def test_a_drop_within_the_tolerance_is_not_harm() -> None:
    v = judge(arm([True] * 800 + [False] * 200), arm([True] * 790 + [False] * 210), SPEC)
    assert not v.worse and v.reason == (
        "no significant harm: success 79.0% treated vs 80.0% control, within the tolerance; "
        "cost per completed task $1.26582 treated vs $1.25000 control, within the tolerance"
    )


def test_no_rollback_yet_says_the_arms_figures() -> None:
    # It said "no significant harm" alone, on GET /v1/policy and /ui/policy, while control completed
    # 66% of the demo's tasks and the treated arm 37% (the learned policy, on 150 tasks each).
    v = judge(arm([True] * 99 + [False] * 51, 0.008), arm([True] * 55 + [False] * 95, 0.002), SPEC)
    assert not v.worse and v.success_lr is not None
    assert v.reason == (
        "no significant harm: success 36.7% treated vs 66.0% control: more than 3.0% worse, not yet "
        f"significant (mSPRT Λ={v.success_lr:.3g} < 40); cost per completed task $0.00545 treated vs "
        "$0.01212 control, within the tolerance"
    )


def test_a_dearer_cost_per_completed_task_rolls_back() -> None:
    rng = random.Random(2)
    control = arm(bernoulli(rng, 0.7, 400), [rng.uniform(0.8, 1.2) for _ in range(400)])
    treated = arm(bernoulli(rng, 0.7, 400), [rng.uniform(1.6, 2.4) for _ in range(400)])
    v = judge(control, treated, SPEC)
    assert v.worse and v.reason.startswith("cost per completed task")


def test_false_alarms_stay_under_alpha_however_often_it_looks() -> None:
    """At the null's edge (treated exactly max_success_drop worse), look every 25 tasks up to 2000
    per arm: the guard rolls back in at most about alpha of the runs, where a z-test repeated at
    every look alarms far more often."""
    rng = random.Random(7)
    runs, guard_alarms, naive_alarms = 150, 0, 0
    spec = GuardSpec(max_success_drop=0.03, max_cost_per_completed_increase=10.0, min_tasks=50, alpha=0.05)
    for _ in range(runs):
        c, t = bernoulli(rng, 0.70, 2000), bernoulli(rng, 0.67, 2000)
        alarmed = naive = False
        for n in range(50, 2001, 25):
            if not alarmed and judge(arm(c[:n]), arm(t[:n]), spec).worse:
                alarmed = True
            pc, pt = sum(c[:n]) / n, sum(t[:n]) / n
            se = math.sqrt((pc * (1 - pc) + pt * (1 - pt)) / n)
            naive = naive or (pc - pt - 0.03) / se > 1.645
        guard_alarms += alarmed
        naive_alarms += naive
    assert guard_alarms / runs <= 0.05 + 0.03  # alpha, with room for the sampling error of 150 runs
    assert naive_alarms / runs > 0.15  # the repeated fixed-sample test: what the mSPRT is for


def test_a_real_harm_is_caught_within_a_few_thousand_tasks() -> None:
    rng = random.Random(11)
    caught = 0
    for _ in range(20):
        c, t = bernoulli(rng, 0.70, 3000), bernoulli(rng, 0.58, 3000)
        caught += any(judge(arm(c[:n]), arm(t[:n]), SPEC).worse for n in range(50, 3001, 100))
    assert caught >= 18


def test_harm_with_no_revision_to_go_back_to_is_said_once_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The only earlier revision was rolled back (or none was ever applied): the guard's rollback
    # raised ConfigError and its loop logged that traceback at every check, forever.
    path = tmp_path / "p.yaml"
    policy = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_text()
    )
    policy["control"] = {"share": 0.5, "route": {"passthrough": "local-mini"}}
    policy["guard"] = {"min_tasks": 10, "check_every_s": 0.5, "max_success_drop": 0.05}
    path.write_text(yaml.safe_dump(policy))
    rt = load_active_policy(path)
    history = PolicyHistory(Archive(path))
    history.applied(rt)

    async def run() -> list[Verdict | None]:
        store = SQLiteStore(str(tmp_path / "log.db"))
        await store.open()
        now = time.time()
        for i in range(40):
            arm_, task = ("control", "treated")[i % 2], f"t{i}"
            await store.write_requests([RequestRecord(
                request_id=f"r{i}", ts=now, task_id=task, attempt=1, status=200, chosen_model="local-mini",
                cost_usd=0.001, arm=arm_, policy_revision=rt.revision,
            )])  # fmt: skip
            await store.write_outcome(OutcomeRecord(
                task_id=task, attempt=1, success=arm_ == "control", score=None, source="explicit",
                details=None, ts=now, explicit=True,
            ))  # fmt: skip
        reloads: list[str] = []

        async def publish(revision: str) -> None:
            reloads.append(revision)

        async def reload() -> None:
            reloads.append("reload")

        guard = Guard(store, history, publish, reload)
        try:
            return [await guard.check(rt), await guard.check(rt)]
        finally:
            assert reloads == []  # nothing was put back
            await store.close()

    with caplog.at_level(logging.WARNING, logger="router.guard"):
        verdicts = asyncio.run(run())
    assert all(v is not None and v.worse for v in verdicts)
    said = [r for r in caplog.records if r.name == "router.guard"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and not said[0].exc_info
    assert "no earlier revision to roll back to" in said[0].getMessage()
    assert history.guard is not None and "no earlier revision" in history.guard["rollback"]
    assert "no earlier revision" in history.describe(rt)["guard"]["rollback"]


def guarded_policy(name: str) -> dict[str, object]:
    policy = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_text()
    )
    policy["name"] = name
    policy["control"] = {"share": 0.5, "route": {"passthrough": "local-mini"}}
    policy["guard"] = {"min_tasks": 10, "check_every_s": 0.5, "max_success_drop": 0.05}
    return policy  # type: ignore[no-any-return]


async def log_tasks(
    store: SQLiteStore, revision: str | None, ts: float, prefix: str, n: int, treated_ok: bool
) -> None:
    """``n`` tasks under ``revision``, half per arm, each with its explicit outcome."""
    for i in range(n):
        arm_, task = ("control", "treated")[i % 2], f"{prefix}{i}"
        await store.write_requests([RequestRecord(
            request_id=f"{prefix}r{i}", ts=ts, task_id=task, attempt=1, status=200, chosen_model="local-mini",
            cost_usd=0.001, arm=arm_, policy_revision=revision,
        )])  # fmt: skip
        await store.write_outcome(OutcomeRecord(
            task_id=task, attempt=1, success=arm_ == "control" or treated_ok, score=None, source="explicit",
            details=None, ts=ts, explicit=True,
        ))  # fmt: skip


def test_a_revision_put_back_is_judged_on_its_new_requests_only(tmp_path: Path) -> None:
    # `router rollback --to X` within a minute of X being rolled back: the guard counted from a
    # minute before X was applied again, found X's earlier tasks (same revision id) and rolled it
    # back once more, 0.13 s after the reload. A revision applied again is a new trial.
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(guarded_policy("good")))
    history = PolicyHistory(Archive(path))
    history.applied(load_active_policy(path))
    path.write_text(yaml.safe_dump(guarded_policy("worse")))
    worse = load_active_policy(path)
    history.applied(worse)

    async def run() -> tuple[Verdict | None, list[str], Verdict | None, Verdict | None]:
        store = SQLiteStore(str(tmp_path / "log.db"))
        await store.open()
        reloads: list[str] = []

        async def publish(revision: str) -> None:
            reloads.append(revision)

        async def reload() -> None:
            reloads.append("reload")

        guard = Guard(store, history, publish, reload)
        try:
            t = time.time()
            await log_tasks(store, worse.revision, t, "old", 40, treated_ok=False)
            first = await guard.check(worse)  # worse: rolled back to "good"
            assert worse.revision is not None
            rollback(history.archive, worse.revision, "operator", t + 1)  # router rollback --to
            again = load_active_policy(path)
            assert again.revision == worse.revision
            at_once = await guard.check(again)
            await log_tasks(store, again.revision, t + 2, "new", 20, treated_ok=True)
            later = await guard.check(again)
            return first, reloads, at_once, later
        finally:
            await store.close()

    first, reloads, at_once, later = asyncio.run(run())
    assert first is not None and first.worse and reloads[-1] == "reload"
    assert at_once is not None and not at_once.worse
    assert (at_once.control_tasks, at_once.treated_tasks) == (0, 0), at_once.reason
    assert later is not None and not later.worse
    assert (later.control_tasks, later.treated_tasks) == (10, 10), later.reason


def keyed(successes: list[bool], keys: list[str | None]) -> ArmTasks:
    a = arm(successes)
    a.keys = keys
    return a


def test_one_key_cannot_decide_a_rollback() -> None:
    # Three keys see no harm; a fourth reports all its treated tasks failed.
    control = keyed([True] * 90, ["a", "b", "c"] * 20 + ["evil"] * 30)
    treated = keyed([True] * 60 + [False] * 30, ["a", "b", "c"] * 20 + ["evil"] * 30)
    assert judge(arm([True] * 90), arm([True] * 60 + [False] * 30), SPEC).worse  # unkeyed: it would
    v = judge(control, treated, SPEC)
    assert not v.worse and v.keys_left_out == 1 and v.reason.startswith("no rollback: without the 1")


def test_harm_seen_by_many_keys_still_rolls_back() -> None:
    keys = [f"k{i}" for i in range(10)] * 30
    v = judge(keyed([True] * 300, keys), keyed([True, False] * 150, keys), SPEC)
    assert v.worse and v.keys_left_out == 1 and "still so without the 1" in v.reason


def test_the_operators_outcomes_are_never_left_out() -> None:
    # Open mode and the master key: no key id; a lone virtual key beside them is left out.
    control = keyed([True] * 100, [None] * 90 + ["k"] * 10)
    treated = keyed([False] * 100, [None] * 90 + ["k"] * 10)
    v = judge(control, treated, SPEC)
    assert v.worse and v.keys_left_out == 1 and v.control_tasks == 100
