"""Policy revisions through a real server: /v1/policy, /readyz, /metrics and the log agree."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import orjson
import pytest
import yaml

from router.app.cli import main
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


def test_a_label_model_rewritten_under_its_pin_shows_on_readyz(  # type: ignore[no-untyped-def]
    router_factory, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Issue 30: a changed label model went unnoticed until the next reload of something else."""
    from router.features.labels.model import DEFAULT_PATH

    raw = DEFAULT_PATH.read_bytes()
    (tmp_path / "labels.json").write_bytes(raw)
    config = tmp_path / "policy.yaml"
    pin = {"artifact": "labels.json", "sha256": hashlib.sha256(raw).hexdigest()}
    config.write_text(yaml.safe_dump({**local_policy(upstream.url), "tasks": {"label_model": pin}}))
    r = router_factory({}, config=config)
    with httpx.Client(base_url=r.url, timeout=10) as c:
        assert c.get("/readyz").json()["status"] == "ok"
        (tmp_path / "labels.json").write_bytes(raw.replace(b"{", b"{ ", 1))
        ready = wait_for(lambda: c.get("/readyz").json(), lambda b: b["status"] == "degraded")
    assert ready["policy_rejected"] and "sha256 mismatch" in ready["policy_rejected"]["error"]  # type: ignore[index]


def test_preview_posted_yaml_against_the_servers_log(
    router_factory, upstream: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    r = router_factory(policy, master_key="mk-preview")
    auth = {"authorization": "Bearer mk-preview"}
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for i in range(3):
            ok = c.post("/v1/chat/completions", headers={**auth, "x-router-task-id": f"t{i}"},
                        json={"model": "auto", "messages": [{"role": "user", "content": f"hi {i}"}]})  # fmt: skip
            assert ok.status_code == 200 and ok.headers["x-router-model"] == "local-nano"
        r.records(3)
        routes = [{**route, "candidates": ["local-mini", "local-large"]} if route["match"] == "auto" else route
                  for route in policy["routes"]]  # fmt: skip
        edited = yaml.safe_dump({**policy, "routes": routes})
        assert c.post("/v1/policy/preview", content=edited).status_code == 401
        got = c.post("/v1/policy/preview", content=edited, headers=auth)
        assert got.status_code == 200, got.text
        p = got.json()
        assert (p["requests"], p["tasks"], p["moved"]) == (3, 3, 3)
        assert p["window"]["capped"] is None
        assert p["moves"] == {"local-nano -> local-mini": 3}
        assert p["cost_usd_after"] > p["cost_usd_before"] > 0
        bad = c.post(
            "/v1/policy/preview", content="version: 1\nmodels: []\nroutes: [{match: x}]\n", headers=auth
        )
        assert bad.status_code == 400 and "routes[0]" in bad.json()["error"]["message"]

    # The command says the same, from the log file.
    new = tmp_path / "new.yaml"
    new.write_text(edited)
    assert main(["preview", "--config", str(new), "--store", f"sqlite:///{r.db_path}", "--json"]) == 0
    printed = orjson.loads(capsys.readouterr().out)
    assert {k: printed[k] for k in ("requests", "moved", "moves")} == {
        k: p[k] for k in ("requests", "moved", "moves")
    }


def test_a_served_preview_reads_at_most_the_latest_requests(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    """The server decides again only the window's latest ``max_window_requests`` (its memory and
    its CPU serve agents meanwhile), and says so; ``router preview`` reads them all."""
    r = router_factory(local_policy(upstream.url), max_window_requests=2)
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for i in range(3):
            ok = c.post("/v1/chat/completions", headers={"x-router-task-id": f"t{i}"},
                        json={"model": "auto", "messages": [{"role": "user", "content": f"hi {i}"}]})  # fmt: skip
            assert ok.status_code == 200
        rows = r.records(3)
        got = c.post("/v1/policy/preview", content=yaml.safe_dump(local_policy(upstream.url)))
    assert got.status_code == 200, got.text
    p = got.json()
    assert (p["requests"], p["window"]["capped"]) == (2, 2)
    assert p["window"]["since"] == sorted(row["ts"] for row in rows)[1]


def test_a_scope_decides_its_repositorys_tasks(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    scope = {
        "name": "acme",
        "match": {"repo": "acme/*"},
        "routes": [{"match": "auto", "passthrough": "local-large"}],
    }
    r = router_factory(local_policy(upstream.url, scopes=[scope]))

    def chat(text: str, system: str = "", **headers: str) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        got = httpx.post(r.url + "/v1/chat/completions", json={"model": "auto", "messages": messages},
                         headers=headers, timeout=30)  # fmt: skip
        assert got.status_code == 200, got.text
        return got.headers["x-router-model"]

    assert chat("fix it", **{"x-router-repo": "acme/api"}) == "local-large"
    assert chat("fix this", system="origin https://github.com/acme/web.git") == "local-large"
    assert chat("fix another", **{"x-router-repo": "other/api"}) == "local-nano"
    rows = r.records(3)
    assert [row["policy"] for row in rows] == [
        "local-demo/acme/cheapest",
        "local-demo/acme/cheapest",
        "local-demo/cheapest",
    ]
    assert orjson.loads(rows[0]["rule_headers"]) == {"x-router-repo": "acme/api"}
