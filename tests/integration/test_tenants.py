"""One tenant (one virtual key) cannot decide for the others (issue 30), through a real router."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from router.app.cli import main
from router.app.commands.train import read_log
from router.fakeupstream import FakeUpstream
from router.learning.training import dataset
from router.policy.artifact import Artifact
from router.policy.control import CONTROL, arm_of
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_keys import MASTER, create_key
from tests.integration.test_learning import policy as learning_policy

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningRouter]
CHAT = "/v1/chat/completions"


def policy_shown(r: RunningRouter) -> dict[str, Any]:
    return httpx.get(r.url + "/v1/policy", headers={"x-api-key": MASTER}, timeout=10).json()  # type: ignore[no-any-return]


def wait(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def tasks_in(key_id: str, arm: str, n: int) -> list[str]:
    """``n`` task ids that a key's requests put in ``arm`` (the arm is a public hash of the scoped id)."""
    out: list[str] = []
    while len(out) < n:
        task = uuid.uuid4().hex[:12]
        if arm_of(f"{key_id}/{task}", 0.5) == arm:
            out.append(task)
    return out


def run_task(c: httpx.Client, key: str, task: str, success: bool) -> None:
    headers = {"x-api-key": key, "x-router-task-id": task}
    r = c.post(CHAT, json={"model": "auto", "messages": [{"role": "user", "content": task}]}, headers=headers)
    assert r.status_code == 200, r.text
    posted = c.post("/v1/outcomes", json={"task_id": task, "success": success}, headers={"x-api-key": key})
    assert posted.status_code == 200, posted.text


def test_one_key_cannot_roll_the_policy_back_for_everyone(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Three honest keys see both arms succeed; a fourth runs 60 cheap tasks and reports every
    treated one failed. Before, the guard rolled back 2 s later; now it leaves that key out and
    finds no harm. When the honest keys do see harm, it still rolls back."""
    upstream.clear()
    base = local_policy(upstream.url)
    arms = {
        "control": {"share": 0.5, "route": {"passthrough": "local-mini"}},
        "guard": {"min_tasks": 15, "check_every_s": 0.2, "max_success_drop": 0.05},
        "rules": [],
        "routes": [{"match": "auto", "passthrough": "local-mini"}],
    }
    r = router_factory({**base, **arms, "name": "good"}, master_key=MASTER)
    config = r.db_path.parent / "policy.yaml"
    first = policy_shown(r)["revision"]
    config.write_text(yaml.safe_dump({**base, **arms, "name": "next"}))
    assert wait(lambda: policy_shown(r)["name"] == "next")
    trial = policy_shown(r)["revision"]

    honest = [create_key(r, capsys, "--name", f"honest{i}") for i in range(3)]
    attacker = create_key(r, capsys, "--name", "attacker")
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for k in honest:
            for arm in ("control", "treated"):
                for task in tasks_in(k["key_id"], arm, 8):
                    run_task(c, k["key"], task, True)
        for arm in ("control", "treated"):
            for task in tasks_in(attacker["key_id"], arm, 30):
                run_task(c, attacker["key"], task, arm == CONTROL)

        def judged_all() -> bool:
            shown = policy_shown(r)
            g = shown["guard"] or {}
            return shown["revision"] != trial or g.get("keys_left_out", 0) > 0

        assert wait(judged_all)
        time.sleep(1.0)  # five more checks
        shown = policy_shown(r)
        assert shown["revision"] == trial, f"one key rolled the policy back: {shown.get('last_rollback')}"
        assert shown["guard"]["reason"].startswith("no rollback: without the 1 virtual key"), shown["guard"]
        assert shown["guard"]["keys_left_out"] == 1

        # Harm seen by the honest keys themselves is still acted on.
        for k in honest:
            for arm in ("control", "treated"):
                for task in tasks_in(k["key_id"], arm, 8):
                    run_task(c, k["key"], task, arm == CONTROL)
        assert wait(lambda: policy_shown(r)["revision"] == first), policy_shown(r)["guard"]
        assert policy_shown(r)["last_rollback"]["reason"].startswith("guard: success")


def test_one_keys_labels_cannot_reshape_training_for_every_key(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Nineteen keys find every model fine; a twentieth reports each of its tasks the large model
    served as failed, twice as many as the others resolved. Uncapped, that key alone takes the
    large model's P(success) below a half; capped at its share, it moves it far less, and
    `router train` names it."""
    upstream.clear()
    policy = learning_policy(upstream.url, epsilon=1.0)  # every model gets tasks
    r = router_factory(policy, master_key=MASTER)
    config = r.db_path.parent / "policy.yaml"
    honest = [create_key(r, capsys, "--name", f"honest{i}") for i in range(19)]
    attacker = create_key(r, capsys, "--name", "attacker")
    with httpx.Client(base_url=r.url, timeout=30) as c:

        def task(key: str, n: int) -> str:
            headers = {"x-api-key": key, "x-router-task-id": f"t{n}"}
            text = f"Issue #{n}: fix the typo in the readme of module {n}."
            resp = c.post(CHAT, json={"model": "auto", "messages": [{"role": "user", "content": text}]},
                          headers=headers)  # fmt: skip
            assert resp.status_code == 200, resp.text
            return resp.headers["x-router-model"]

        def outcome(key: str, n: int, success: bool) -> None:
            posted = c.post("/v1/outcomes", json={"task_id": f"t{n}", "success": success},
                            headers={"x-api-key": key})  # fmt: skip
            assert posted.status_code == 200, posted.text

        honest_large = 0
        for k in honest:
            for n in range(5):
                honest_large += task(k["key"], n) == "large"
                outcome(k["key"], n, True)
        # Exploration is random, so the honest keys' share of large tasks varies from run to run:
        # the attacker fails twice as many as they resolved, which puts an uncapped fit near a third.
        # A fixed 40 sank it below a half only when the honest keys drew fewer than 40 (a CI flake).
        failed_large = attacker_tasks = 0
        while failed_large < 2 * honest_large:
            attacker_tasks += 1
            if task(attacker["key"], attacker_tasks) == "large":
                outcome(attacker["key"], attacker_tasks, False)
                failed_large += 1
    r.records(95 + attacker_tasks, timeout=15)
    store = f"sqlite:///{r.db_path}"
    capsys.readouterr()

    def p_large(out: Path, *flags: str) -> tuple[float, str]:
        assert (
            main(["train", "--store", store, "--config", str(config), "--out", str(out), "--force", *flags])
            == 0
        )
        printed = capsys.readouterr().out
        artifact = Artifact.load(out, None)
        rows = dataset.build(*asyncio.run(read_log(store)))
        vectors = [row.vector for row in rows if row.facts.key != attacker["key_id"]]
        return sum(artifact.models["large"].p_success(v) for v in vectors) / len(vectors), printed

    uncapped, _ = p_large(tmp_path / "uncapped.json", "--max-key-share", "1")
    capped, printed = p_large(tmp_path / "capped.json")
    assert uncapped < 0.5, uncapped  # what one key did before
    assert capped > uncapped + 0.2 and capped > 0.6, (capped, uncapped)
    assert f"key {attacker['key_id']} dominates the labels" in printed
    dominant = orjson.loads((tmp_path / "capped.json").read_bytes())["dominant_keys"]
    assert [d["key"] for d in dominant] == [attacker["key_id"]]


def test_one_key_cannot_evict_every_tenants_task_state(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """The router remembers a bounded number of live tasks (``max_tasks``). A key opening tasks
    without end pushed out every other key's: here the victim's failed attempt was forgotten, so
    its restart stayed attempt 1. Now a key holds at most a tenth of the table and drops its own."""
    upstream.clear()
    r = router_factory(local_policy(upstream.url), master_key=MASTER, max_tasks=50)
    victim, flood = create_key(r, capsys, "--name", "victim"), create_key(r, capsys, "--name", "flood")
    opening = {"model": "auto", "messages": [{"role": "user", "content": "fix the flaky test"}]}
    with httpx.Client(base_url=r.url, timeout=30) as c:

        def chat(key: str, task: str) -> None:
            resp = c.post(CHAT, json=opening, headers={"x-api-key": key, "x-router-task-id": task})
            assert resp.status_code == 200, resp.text

        chat(victim["key"], "mine")
        failed = c.post("/v1/outcomes", json={"task_id": "mine", "success": False},
                        headers={"x-api-key": victim["key"]})  # fmt: skip
        assert failed.status_code == 200, failed.text
        for i in range(60):
            chat(flood["key"], f"flood-{i}")
        chat(victim["key"], "mine")  # the conversation starts over after the failure
    attempts = [row["attempt"] for row in r.records(62) if row["task_id"] == f"{victim['key_id']}/mine"]
    assert attempts == [1, 2], f"the victim's task state was evicted by another key: {attempts}"


def slow_policy(up: str) -> dict[str, Any]:
    """``shared`` takes 1 ms per output token the request allows before a whole reply, as a
    provider does writing a reply that long; ``spare`` answers at once."""
    spec = {"protocol": "openai", "api_base": up + "/v1", "context_window": 100_000,
            "max_output_tokens": 8192, "prices": {"input": 1.0, "output": 2.0}}  # fmt: skip
    return {
        "version": 1,
        "name": "breakers",
        "models": [
            {"id": "shared", "litellm_model": "openai/shared-model@ms_per_max_token=1", **spec},
            {
                "id": "spare",
                "litellm_model": "openai/spare-model",
                **spec,
                "prices": {"input": 2.0, "output": 4.0},
            },
        ],
        "routes": [{"match": "auto", "candidates": ["shared", "spare"]}],
    }


def test_one_keys_timeouts_do_not_open_a_backends_breaker_for_everyone(
    router_factory: Factory, upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key asking for replies longer than the idle timeout allows (here 4,000 tokens at 1 ms
    each against 0.5 s) had every one given up by a timeout, and five in a row opened the
    backend's breaker: every key's requests went to the spare for the cool-down. A backend that
    times out for two keys still has its breaker opened."""
    from router.forward.timeouts import Timeouts

    fast = Timeouts(connect=1.0, first_token=0.5, idle=0.5, overall=20.0)
    r = router_factory(slow_policy(upstream.url), master_key=MASTER, timeouts=fast)
    heavy, light = create_key(r, capsys, "--name", "heavy"), create_key(r, capsys, "--name", "light")

    def ask(c: httpx.Client, key: str, max_tokens: int) -> str:
        body = {"model": "auto", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
        # A task of its own each: a task's fallback pins it to the spare, off the backend.
        resp = c.post(CHAT, json=body, headers={"x-api-key": key, "x-router-task-id": uuid.uuid4().hex})
        assert resp.status_code == 200, resp.text
        return resp.headers["x-router-model"]

    with httpx.Client(base_url=r.url, timeout=30) as c:
        for _ in range(8):  # the threshold is 5 failures in a row
            assert ask(c, heavy["key"], 4000) == "spare"  # given up on shared, served by the spare
        assert ask(c, light["key"], 10) == "shared", "one key's timeouts moved another key's traffic"
        # The light key's success ended the row; now both keys' requests time out on shared.
        served = [ask(c, key, 4000) for key in [heavy["key"], light["key"]] * 3]
        assert served == ["spare"] * 6
        assert ask(c, light["key"], 10) == "spare", "a backend failing for two keys kept its breaker closed"
    rows = r.records(17)
    last = orjson.loads(rows[-1]["tries"])
    assert [t["model"] for t in last] == ["shared", "spare"] and last[0]["error_type"] == "BreakerOpen"
