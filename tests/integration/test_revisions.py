"""Policy revisions through a real server: /v1/policy, /readyz, /metrics and the log agree."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import local_policy

pytestmark = pytest.mark.integration


def wait_for(get: object, check: object, timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = get()  # type: ignore[operator]
        if check(value) or time.monotonic() > deadline:  # type: ignore[operator]
            return value


def test_revisions_rejections_and_the_log(router_factory, upstream: FakeUpstream, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "policy.yaml"
    policy = local_policy(upstream.url)
    config.write_text(yaml.safe_dump(policy))
    r = router_factory({}, config=config, master_key="mk-revisions")
    auth = {"authorization": "Bearer mk-revisions"}
    with httpx.Client(base_url=r.url, timeout=10) as c:
        assert c.get("/v1/policy").status_code == 401
        first = c.get("/v1/policy", headers=auth).json()
        assert len(first["revision"]) == 12 and first["name"] == "local-demo"
        assert first["previous"] == [] and first["last_rejected"] is None
        ok = c.post("/v1/chat/completions", headers=auth,
                    json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert ok.status_code == 200
        assert r.records(1)[0]["policy_revision"] == first["revision"]

        config.write_text(yaml.safe_dump({**policy, "routes": [{"match": "auto"}]}))  # refused
        ready = wait_for(lambda: c.get("/readyz").json(), lambda b: b["status"] == "degraded")
        assert ready["policy_rejected"] and "routes[0]" in ready["policy_rejected"]["error"]  # type: ignore[index]
        assert ready["policy_revision"] == first["revision"]  # type: ignore[index]
        metrics = c.get("/metrics").text
        assert "router_policy_reloads_rejected_total 1.0" in metrics
        assert f'router_policy_info{{name="local-demo",revision="{first["revision"]}"' in metrics

        config.write_text(yaml.safe_dump({**policy, "name": "local-demo-2"}))
        now = wait_for(
            lambda: c.get("/v1/policy", headers=auth).json(), lambda b: b["name"] == "local-demo-2"
        )
        assert now["revision"] != first["revision"] and now["last_rejected"] is None  # type: ignore[index]
        assert [p["revision"] for p in now["previous"]] == [first["revision"]]  # type: ignore[index]
        assert c.get("/readyz").json()["status"] == "ok"
        assert "router_policy_rejected 0.0" in c.get("/metrics").text
