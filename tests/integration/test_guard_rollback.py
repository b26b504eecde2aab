"""The guard rolls a worse policy back by itself, across two replicas sharing Redis and PostgreSQL.

Revision "good" sends every task to local-mini; revision "worse" sends the treated arm to
local-nano, which the fake provider makes fail (its per-model ``status`` knob). The test plays
the agent harness: it posts each task's outcome (a failure when the request failed). Half the
tasks are in the control arm (local-mini in both revisions), so the guard sees the treated arm
complete far fewer tasks, and one of the replicas puts "good" back; both end up serving it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from router.app.cli import main
from router.fakeupstream import FakeUpstream
from router.policy.revisions import Archive
from tests.integration.conftest import local_policy
from tests.integration.test_replicas import CHAT, body, pair, pg_schema, pg_url  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration


def revision(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/policy", timeout=10).json()  # type: ignore[no-any-return]


def wait(check: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_worse_policy_is_rolled_back_on_both_replicas(  # type: ignore[no-untyped-def]
    pair,  # noqa: F811 (the fixture imported above)
    upstream: FakeUpstream,
    pg_schema: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = local_policy(upstream.url)
    arms = {
        "control": {"share": 0.5, "route": {"passthrough": "local-mini"}},
        "guard": {"min_tasks": 15, "check_every_s": 0.2, "max_success_drop": 0.05},
        "rules": [],
    }
    good = {**base, **arms, "name": "good", "routes": [{"match": "auto", "passthrough": "local-mini"}]}
    worse = {**base, **arms, "name": "worse", "routes": [{"match": "auto", "passthrough": "local-nano"}]}
    a, b, config = pair(good)
    first = revision(a.url)
    assert first["name"] == "good" and revision(b.url)["revision"] == first["revision"]

    Path(config).write_text(yaml.safe_dump(worse))
    assert wait(lambda: revision(a.url)["name"] == revision(b.url)["name"] == "worse")
    bad = revision(a.url)["revision"]
    upstream.set_behaviour("nano-model", status=500)
    try:
        served: dict[str, int] = {}
        i = 0
        while revision(a.url)["name"] == "worse" and i < 400:
            replica = (a, b)[i % 2]
            task = f"guard-{uuid.uuid4().hex[:10]}"
            r = httpx.post(
                replica.url + CHAT, json=body(f"task {i}"), headers={"x-router-task-id": task}, timeout=30
            )
            model = r.headers.get("x-router-model", "none")
            served[model] = served.get(model, 0) + 1
            ok = r.status_code == 200 and i % 7 != 0  # even control fails now and then
            posted = httpx.post(
                replica.url + "/v1/outcomes", json={"task_id": task, "success": ok}, timeout=10
            )
            assert posted.status_code == 200, posted.text
            i += 1
    finally:
        upstream.set_behaviour("nano-model")
    assert served.get("local-mini", 0) > 10 and served.get("local-nano", 0) > 10, served

    # Both replicas serve "good" again: one rolled back, the other followed (Redis nudge or file poll).
    assert wait(lambda: revision(a.url)["revision"] == revision(b.url)["revision"] == first["revision"])
    for r in (a, b):
        shown = revision(r.url)
        assert shown["last_rollback"]["from"] == bad and shown["last_rollback"]["to"] == first["revision"]
        assert shown["last_rollback"]["reason"].startswith("guard: success")
    rollbacks = [
        float(line.split()[-1])
        for r in (a, b)
        for line in httpx.get(r.url + "/metrics", timeout=10).text.splitlines()
        if line.startswith("router_policy_rollbacks_total")
    ]
    assert sum(rollbacks) == 1.0  # one replica rolled back; the other did not roll back again
    archive = Archive(Path(config))
    assert Path(config).read_text() == (archive.dir / first["revision"] / "policy.yaml").read_text()
    assert archive.meta(bad)["rolled_back"]["to"] == first["revision"]  # type: ignore[index]

    # The per-arm report over the same log shows what the guard saw.
    assert main(["report", "--by", "arm", "--store", pg_url(pg_schema), "--json", "--since", "1h"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    judged = next(rev for rev in report["revisions"] if rev["revision"] == bad)["arms"]
    assert judged["treated"]["success_rate"] == 0.0 and judged["control"]["success_rate"] > 0.5
    lo, hi = judged["control"]["success_ci95"]
    assert lo <= judged["control"]["success_rate"] <= hi and lo < hi

    # The operator puts "worse" back within the minute: a new trial that starts from zero. The
    # guard (a check every 0.2 s) judged it at once on its earlier tasks and rolled it back again.
    assert main(["rollback", "--to", bad, "--config", str(config)]) == 0
    assert wait(lambda: revision(a.url)["revision"] == revision(b.url)["revision"] == bad)

    def judged_again() -> bool:
        return all((revision(r.url)["guard"] or {}).get("revision") == bad for r in (a, b))

    assert wait(judged_again)
    for r in (a, b):
        shown = revision(r.url)
        assert shown["revision"] == bad, shown
        assert shown["guard"]["reason"].startswith("waiting: 0 control and 0 treated"), shown["guard"]
