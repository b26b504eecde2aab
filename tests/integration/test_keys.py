"""Virtual keys through a running router: 401/403 in each protocol's shape, the key id in the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from router.app.cli import main
from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.http.auth import Auth
from router.store.postgres import PostgresStore
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_store_postgres import pg_url  # noqa: F401 - the fixture
from tests.polling import wait_for
from tests.unit.test_keys import check_keys

pytestmark = pytest.mark.integration

MASTER = "master-key-for-tests-0123456789"
BODIES = {
    "/v1/chat/completions": {"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages": {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"model": "auto", "input": "hi"},
}


def create_key(router: RunningRouter, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    assert main(["keys", "create", "--store", f"sqlite:///{router.db_path}", "--json", *flags]) == 0
    made: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return made


def error_type(path: str, r: httpx.Response) -> str:
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
    kind: str = body["error"]["type"]
    return kind


def short_ttl(s: Services) -> None:
    s.auth = Auth(s.settings.master_key, s.store, ttl=0.2)


@pytest.fixture
def closed(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> RunningRouter:
    return router_factory(local_policy(upstream.url), master_key=MASTER, services_hook=short_ttl)


@pytest.mark.parametrize("path", list(BODIES))
def test_keys_in_every_protocol(closed: RunningRouter, capsys: pytest.CaptureFixture[str], path: str) -> None:
    made = create_key(closed, capsys, "--name", "agent")
    limited = create_key(closed, capsys, "--name", "large-only", "--models", "local-large")
    with httpx.Client(base_url=closed.url, timeout=20) as c:
        body = BODIES[path]
        r = c.post(path, json=body)
        assert r.status_code == 401 and error_type(path, r) == "authentication_error"
        wrong = made["key"][:-1] + ("B" if made["key"].endswith("A") else "A")
        r = c.post(path, json=body, headers={"authorization": "Bearer " + wrong})
        assert r.status_code == 401 and made["key"][:-1] not in r.text
        r = c.post(path, json=body, headers={"x-api-key": MASTER})
        assert r.status_code == 200, r.text
        r = c.post(path, json=body, headers={"authorization": "Bearer " + made["key"]})
        assert r.status_code == 200, r.text
        rid = r.headers["x-request-id"]
        r = c.post(path, json=body, headers={"x-api-key": limited["key"]})
        assert r.status_code == 403 and error_type(path, r) == "permission_error"
        assert limited["key"] not in r.text
        r = c.post(path, json={**body, "model": "local-large"}, headers={"x-api-key": limited["key"]})
        assert r.status_code == 200, r.text
    rows = {row["request_id"]: row for row in closed.records(6)}
    assert rows[rid]["key_id"] == made["key_id"] and rows[rid]["status"] == 200
    assert {row["key_id"] for row in rows.values()} >= {None, made["key_id"], limited["key_id"]}


def test_revocation_takes_effect_within_the_ttl(
    closed: RunningRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    made = create_key(closed, capsys, "--name", "soon-revoked")
    headers = {"authorization": "Bearer " + made["key"]}
    with httpx.Client(base_url=closed.url, timeout=20) as c:
        assert c.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"], headers=headers).is_success
        assert main(["keys", "revoke", made["key_id"], "--store", f"sqlite:///{closed.db_path}"]) == 0
        capsys.readouterr()

        def refused() -> httpx.Response | None:
            r = c.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"], headers=headers)
            return r if r.status_code == 401 else None

        # The key's cache entry lives 0.2 s (short_ttl): poll, bounded well below the default 30 s.
        r = wait_for(refused, within=3.0, what="the revocation")
        assert "revoked" in r.json()["error"]["message"]


def test_management_endpoints_need_the_master_key(
    closed: RunningRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    made = create_key(closed, capsys, "--name", "agent")
    with httpx.Client(base_url=closed.url, timeout=20) as c:
        r = c.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"],
                   headers={"x-api-key": made["key"], "x-router-task-id": "task-keys"})  # fmt: skip
        assert r.is_success
        closed.records(1)
        # A key reads its own task's ledger; the master key reads it under the key's scope.
        assert c.get("/v1/tasks/task-keys", headers={"x-api-key": made["key"]}).status_code == 200
        assert c.get("/v1/tasks/task-keys").status_code == 401
        scoped = f"/v1/tasks/{made['key_id']}/task-keys"
        assert c.get(scoped, headers={"x-api-key": MASTER}).status_code == 200
        # The other authenticated endpoints take virtual keys.
        assert c.post("/v1/route", json=BODIES["/v1/chat/completions"]).status_code == 401
        assert c.post(
            "/v1/route", json=BODIES["/v1/chat/completions"], headers={"x-api-key": made["key"]}
        ).is_success
        count = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}
        assert c.post("/v1/messages/count_tokens", json=count).status_code == 401
        assert c.post("/v1/messages/count_tokens", json=count, headers={"x-api-key": made["key"]}).is_success


def test_startup_names_the_mode(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="router.http.auth")
    router_factory(local_policy(upstream.url))
    router_factory(local_policy(upstream.url), master_key=MASTER)
    text = caplog.text
    assert "OPEN MODE" in text and "master key mode" in text
    assert MASTER not in text


async def test_postgres_keys_table(pg_url: str) -> None:  # noqa: F811 - the fixture
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await check_keys(store)
    finally:
        await store.close()


def test_a_restricted_key_sees_only_the_models_it_may_use(
    closed: RunningRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: a key restricted to ``auto`` was shown every backend id, and each route's candidates."""
    auto_only = create_key(closed, capsys, "--name", "auto-only", "--models", "auto")
    with httpx.Client(base_url=closed.url, timeout=20) as c:
        listed = c.get("/v1/models", headers={"x-api-key": auto_only["key"]}).json()
        assert [m["id"] for m in listed["data"]] == ["auto"]
        assert listed["routes"] == [{"match": "auto"}]
        assert "local-large" not in orjson.dumps(listed).decode()
        assert c.get("/v1/models/local-large", headers={"x-api-key": auto_only["key"]}).status_code == 404
        assert c.get("/v1/models/auto", headers={"x-api-key": auto_only["key"]}).status_code == 200
        everything = c.get("/v1/models", headers={"x-api-key": MASTER}).json()
        assert "local-large" in {m["id"] for m in everything["data"]} and "candidates" in str(
            everything["routes"]
        )


@pytest.mark.parametrize("pasted", [MASTER + "\n", MASTER + " ", " " + MASTER + "\r\n"])
def test_a_master_key_pasted_with_whitespace_still_matches(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    pasted: str,
) -> None:
    """``ROUTER_MASTER_KEY=$(cat key.txt)`` keeps no newline, but an env file or a secret mounted
    from a file does: the key the operator hands out (without it) was refused with 401, and so was
    the key pasted into the dashboard's login with a newline."""
    monkeypatch.setenv("ROUTER_MASTER_KEY", pasted)
    r = router_factory(local_policy(upstream.url))
    with httpx.Client(base_url=r.url, timeout=20) as c:
        for path, body in BODIES.items():
            bearer = c.post(path, json=body, headers={"authorization": f"Bearer {MASTER}"})
            header = c.post(path, json=body, headers={"x-api-key": MASTER})
            assert (bearer.status_code, header.status_code) == (200, 200), (path, bearer.text, header.text)
        assert c.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"]).status_code == 401
        # Copied into the dashboard's login form, with the newline a copy from a terminal takes along.
        login = c.post("/ui/login", data={"key": MASTER + "\n", "next": "/ui"})
        assert login.status_code == 303 and "set-cookie" in login.headers


def test_a_provider_key_pasted_with_a_newline_is_sent_without_it(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider key whose variable ends in a newline could not be put in a header at all: every
    call to its backends failed (relayed and translated alike)."""
    monkeypatch.setenv("ROUTER_TEST_PROVIDER_KEY", "sk-pasted-0123456789\n")
    policy = local_policy(upstream.url)
    for m in policy["models"]:
        m["api_key_env"] = "ROUTER_TEST_PROVIDER_KEY"
    policy["routes"].insert(0, {"match": "local-nano", "passthrough": "local-nano"})
    r = router_factory(policy)
    upstream.clear()
    with httpx.Client(base_url=r.url, timeout=20) as c:
        for path, body in BODIES.items():
            reply = c.post(path, json={**body, "model": "local-nano"})
            assert reply.status_code == 200, (path, reply.text)
    sent = upstream.requests()
    assert len(sent) == len(BODIES)
    for req in sent:
        assert req["headers"]["authorization"] == "Bearer sk-pasted-0123456789"


def test_a_keys_tokens_per_minute_count_what_its_calls_used(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--tpm`` counted each request's estimate alone (its prompt and the output the router
    expects, ~1,000 tokens here), never what the call used: a key limited to 5,000 tokens a minute
    was served four replies of ~6,400 tokens each in one minute, 25,576 tokens (found by a hostile
    probe asking for long replies). What a call used now replaces its estimate once it ends, so the
    next request of that minute is refused, and a call that used less gives the rest back."""
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@big_kb=40"  # ~6,400-token replies
    policy["routes"][0]["candidates"] = ["local-nano"]
    policy["rules"] = []
    r = router_factory(policy, master_key=MASTER)
    key = create_key(r, capsys, "--name", "long-replies", "--tpm", "5000")["key"]

    def ask(i: int) -> httpx.Response:
        body = {"model": "auto", "messages": [{"role": "user", "content": f"write a long essay {i}"}]}
        return httpx.post(r.url + "/v1/chat/completions", json=body, headers={"x-api-key": key}, timeout=30)

    first = ask(0)
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["total_tokens"]
    assert used > 5000  # more than the key's minute allows, though its estimate was far less

    time.sleep(0.5)  # the count is corrected just after the reply, off the client's path
    second = ask(1)
    assert second.status_code == 429, f"served {used} tokens and then {second.text[:200]}"
    assert second.json()["error"]["message"] == "this key's tpm limit is reached"
