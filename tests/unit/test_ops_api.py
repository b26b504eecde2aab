"""The ops API's answers to bad input: 400 in the same error shape as every other endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.fakeupstream import FakeUpstream
from tests.unit.inprocess import MASTER, serving
from tests.unit.requestpath import model

AS_MASTER = {"authorization": f"Bearer {MASTER}"}


def error_of(r: object, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    body = r.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and body["error"]["type"] == "invalid_request_error", body
    return body["error"]  # type: ignore[no-any-return]


async def test_a_malformed_outcome_is_a_400_like_the_rest(fake: FakeUpstream, tmp_path: Path) -> None:
    # It answered 422 (the only endpoint to): clients handling 400s missed it.
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        assert (await r.post(headers={"x-router-task-id": "t1", **AS_MASTER})).status_code == 200
        typo = await r.client.post("/v1/outcomes", json={"task_id": "t1", "sucess": True}, headers=AS_MASTER)
        wrong = await r.client.post(
            "/v1/outcomes", json={"task_id": "t1", "success": "maybe"}, headers=AS_MASTER
        )
        # A verdict must be a JSON boolean: lax coercion stored "yes" and 1 as successes, "false" as a failure.
        guessed = [
            await r.client.post("/v1/outcomes", json={"task_id": "t1", "success": v}, headers=AS_MASTER)
            for v in ("yes", "false", 1)
        ]
        good = await r.client.post("/v1/outcomes", json={"task_id": "t1", "success": True}, headers=AS_MASTER)
        other = await r.client.post("/v1/policy/preview?since=soon", content=b"x", headers=AS_MASTER)
    assert "success" in str(error_of(typo, 400)["message"])
    assert "success" in str(error_of(wrong, 400)["message"])
    for g in guessed:
        assert "success" in str(error_of(g, 400)["message"])
    assert good.status_code == 200
    assert set(error_of(other, 400)) == set(error_of(wrong, 400))  # the same shape as the rest


async def test_an_outcomes_details_are_capped(fake: FakeUpstream, tmp_path: Path) -> None:
    # Kept whatever their size (up to the 32 MiB body cap): one key's few cheap tasks could fill the
    # disk, and each dashboard view read every outcome of its window into the router's memory.
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        assert (await r.post(headers={"x-router-task-id": "t1", **AS_MASTER})).status_code == 200
        huge = {"task_id": "t1", "success": False, "details": {"log": "x" * 1_000_000}}
        refused = await r.client.post("/v1/outcomes", json=huge, headers=AS_MASTER)
        fits = {"task_id": "t1", "success": False, "details": {"log": "x" * 60_000, "failed": 3}}
        kept = await r.client.post("/v1/outcomes", json=fits, headers=AS_MASTER)
        stored = await r.s.store.outcomes_since(0)
    error = error_of(refused, 400)
    assert error["param"] == "details" and "1000010 bytes" in str(error["message"])
    assert kept.status_code == 200, kept.text
    assert [o.details for o in stored] == [fits["details"]]


async def test_numbers_a_client_sends_in_a_header_or_a_query_are_read_or_ignored_never_a_500(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # '³' (a latin-1 byte in a header, '%C2%B3' in a query) and 5,000 nines passed str.isdigit() and
    # were a 500 with a traceback from int(): X-Router-Attempt on every proxied endpoint and
    # POST /v1/route, and the dashboard's page number.
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        for sent, attempt in (("\xb3".encode("latin-1"), 1), ("9" * 5000, 1000), ("0002", 2)):
            headers = {**AS_MASTER, "x-router-task-id": "t1", "x-router-attempt": sent}
            served = await r.post(headers=headers)  # type: ignore[dict-item]
            assert served.status_code == 200, served.text
            body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
            decided = await r.client.post("/v1/route", json=body, headers=headers)
            assert decided.status_code == 200 and decided.json()["attempt"] == attempt, decided.text
    (tmp_path / "open").mkdir()
    async with serving(tmp_path / "open", [model("a", fake.url)]) as r:
        for page in ("%C2%B3", "9" * 5000):
            assert (await r.client.get(f"/ui/tasks?page={page}")).status_code == 200


async def test_tasks_without_an_id_says_one_is_needed(fake: FakeUpstream, tmp_path: Path) -> None:
    # GET /v1/tasks redirected (307) to /v1/tasks/, which answered "no request of task ''".
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        bare = await r.client.get("/v1/tasks", headers=AS_MASTER)
        slash = await r.client.get("/v1/tasks/", headers=AS_MASTER)
        unknown = await r.client.get("/v1/tasks/nope", headers=AS_MASTER)
        anonymous = await r.client.get("/v1/tasks")
    for answer in (bare, slash):
        error = error_of(answer, 400)
        assert error["code"] == "task_id_required" and "GET /v1/tasks/{task_id}" in str(error["message"])
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "task_not_found"
    assert anonymous.status_code == 401


async def test_a_model_the_list_gives_can_be_retrieved(fake: FakeUpstream, tmp_path: Path) -> None:
    # The SDKs' models.retrieve("auto") got a bare 404 "Not Found" for a name GET /v1/models lists.
    import openai

    auth = {"authorization": f"Bearer {MASTER}"}
    # No catch-all route: under "*" every name is served, and retrieved as such.
    routes = {"routes": [{"match": "auto", "candidates": ["a"]}, {"match": "a", "passthrough": "a"}]}
    async with serving(tmp_path, [model("a", fake.url)], policy=routes, master_key=MASTER) as r:
        listed = (await r.client.get("/v1/models", headers=auth)).json()["data"]
        for entry in listed:
            one = await r.client.get(f"/v1/models/{entry['id']}", headers=auth)
            assert one.status_code == 200 and one.json() == entry
        oai = openai.AsyncOpenAI(
            base_url="http://router/v1", api_key=MASTER, http_client=r.client, max_retries=0
        )
        assert (await oai.models.retrieve("a")).id == "a"
        try:
            await oai.models.retrieve("nope")
            raise AssertionError("retrieved a model that is not served")
        except openai.NotFoundError as err:
            # The names the key may ask for, as the chat 404 gives them: not a pointer to another request.
            names = ", ".join(e["id"] for e in listed)
            assert (
                err.code == "model_not_found"
                and f"'nope' is not served here; ask for one of: {names}" in err.message
            )
        # Anthropic's SDK sends anthropic-version: the error comes in its shape.
        missing = await r.client.get(
            "/v1/models/claude-nope", headers={**auth, "anthropic-version": "2023-06-01"}
        )
        assert missing.status_code == 404
        assert missing.json()["type"] == "error" and missing.json()["error"]["type"] == "not_found_error"
        assert (await r.client.get("/v1/models/a")).status_code == 401


async def test_a_missing_models_404_suggests_only_names_a_route_serves(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # It suggested every listed name, backends no route serves among them, and asking for one of
    # those was a 404 of its own ("no route serves that name").
    routes = {"routes": [{"match": "auto", "candidates": ["a", "b"]}, {"match": "b", "passthrough": "b"}]}
    models = [model("a", fake.url), model("b", fake.url)]
    async with serving(tmp_path, models, policy=routes, master_key=MASTER) as r:
        missing = await r.client.get("/v1/models/nope", headers=AS_MASTER)
        message = str(error_of(missing, 404)["message"])
        suggested = message.split("ask for one of: ")[1].split(", ")
        asked = [await r.post(model=name, headers=AS_MASTER) for name in suggested]
    assert suggested == ["auto", "b"], message
    assert [a.status_code for a in asked] == [200, 200]


async def test_a_name_a_pattern_route_serves_is_a_model_too(fake: FakeUpstream, tmp_path: Path) -> None:
    # claude-sonnet-4-5 under a claude-* route was served by POST and a 404 on GET /v1/models/{id}
    # (an SDK's models.retrieve before its first call); it has its route's largest limits.
    routes = {"routes": [{"match": "claude-*", "candidates": ["a", "b"]}]}
    models = [model("a", fake.url, window=8_000), model("b", fake.url, window=32_000)]
    async with serving(tmp_path, models, policy=routes, master_key=MASTER) as r:
        one = await r.client.get("/v1/models/claude-sonnet-4-5", headers=AS_MASTER)
        served = await r.post(model="claude-sonnet-4-5", headers=AS_MASTER)
        other = await r.client.get("/v1/models/gpt-5", headers=AS_MASTER)
    assert one.status_code == 200, one.text
    assert (one.json()["id"], one.json()["context_length"]) == ("claude-sonnet-4-5", 32_000)
    assert served.status_code == 200
    error_of(other, 404)


async def test_models_are_created_when_the_catalog_was_loaded(fake: FakeUpstream, tmp_path: Path) -> None:
    # `created` was the process's start, and Anthropic's `created_at` the epoch, whatever reloads did.
    import dataclasses

    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        r.s.runtime.install(dataclasses.replace(r.s.runtime.current, applied_at=1_767_225_600.5))
        listed = (await r.client.get("/v1/models", headers=AS_MASTER)).json()["data"]
        one = (await r.client.get("/v1/models/a", headers=AS_MASTER)).json()
    assert {(m["created"], m["created_at"]) for m in [*listed, one]} == {
        (1_767_225_600, "2026-01-01T00:00:00Z")
    }


async def test_a_wrong_path_says_what_the_base_url_should_be(fake: FakeUpstream, tmp_path: Path) -> None:
    # Each was a bare "Not Found" (or "Method Not Allowed"): the usual first-hour slip is a base URL
    # without /v1 for an OpenAI client, or with it for an Anthropic one.
    auth = {"authorization": f"Bearer {MASTER}"}
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        no_v1 = await r.client.post("/chat/completions", headers=auth, json={"model": "auto"})
        twice = await r.client.post("/v1/v1/messages", headers=auth, json={"model": "claude-x"})
        other = await r.client.get("/v2/things", headers=auth)
        method = await r.client.get("/v1/chat/completions", headers=auth)
    assert error_of(no_v1, 404)["message"] == (
        "no endpoint /chat/completions: the router serves /v1/chat/completions, so an OpenAI client's base URL "
        "ends in /v1"
    )
    assert twice.status_code == 404 and twice.json()["error"] == {
        "type": "not_found_error",
        "message": "no endpoint /v1/v1/messages: the base URL ends in /v1 and the client adds its own; an "
        "Anthropic client's base URL is the router's address alone",
    }
    assert error_of(other, 404)["message"] == (
        "no endpoint GET /v2/things: the router serves POST /v1/chat/completions, /v1/messages, /v1/responses "
        "and GET /v1/models"
    )
    assert error_of(method, 405)["message"] == "GET is not allowed on /v1/chat/completions (allowed: POST)"


async def test_a_restricted_key_gets_no_decision_for_a_model_it_may_not_use(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """POST /v1/route decided for any model, so a key limited to ``auto`` read the backends, their
    prices and the route of a model the proxy refuses it (403), which GET /v1/models hides."""
    policy = {"routes": [{"match": "auto", "candidates": ["a"]}, {"match": "big", "passthrough": "b"}]}
    async with serving(
        tmp_path, [model("a", fake.url), model("b", fake.url)], policy=policy, master_key=MASTER
    ) as r:
        key, _ = await r.key(models=["auto"])
        body = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}
        as_key = {"authorization": f"Bearer {key}"}
        refused = await r.client.post("/v1/route", json=body, headers=as_key)
        allowed = await r.client.post("/v1/route", json={**body, "model": "auto"}, headers=as_key)
        proxied = await r.client.post("/v1/chat/completions", json=body, headers=as_key)
    assert refused.status_code == proxied.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error" and "chosen" not in refused.json()
    assert allowed.status_code == 200 and allowed.json()["chosen"] == "a"


async def test_a_tasks_ledger_counts_the_request_just_answered(fake: FakeUpstream, tmp_path: Path) -> None:
    # The ledger read the store alone, which the log's writer fills in batches (every 0.1 s): read
    # right after a reply (a harness checking what its task cost), the task was a 404 "no request
    # of task", or its ledger lacked the latest request and its cost.
    async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
        costs = []
        for _ in range(3):
            reply = await r.post(headers={"x-router-task-id": "t-now", **AS_MASTER})
            costs.append(float(reply.headers["x-router-cost-usd"]))
            ledger = await r.client.get("/v1/tasks/t-now", headers=AS_MASTER)
            assert ledger.status_code == 200, ledger.text
            assert ledger.json()["requests"] == len(costs)
            assert abs(ledger.json()["cost_usd"]["total"] - sum(costs)) < 1e-9


async def test_a_restricted_key_gets_no_token_count_for_a_model_it_may_not_use(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # POST /v1/messages/count_tokens counted for any model, where /v1/messages refuses the key (403).
    policy = {"routes": [{"match": "auto", "candidates": ["a"]}, {"match": "big", "passthrough": "b"}]}
    async with serving(
        tmp_path, [model("a", fake.url), model("b", fake.url)], policy=policy, master_key=MASTER
    ) as r:
        key, _ = await r.key(models=["auto"])
        body = {"model": "big", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        as_key = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        counted = await r.client.post("/v1/messages/count_tokens", json=body, headers=as_key)
        proxied = await r.client.post("/v1/messages", json=body, headers=as_key)
        allowed = await r.client.post(
            "/v1/messages/count_tokens", json={**body, "model": "auto"}, headers=as_key
        )
    assert counted.status_code == proxied.status_code == 403, counted.text
    assert counted.json() == proxied.json() and counted.json()["error"]["type"] == "permission_error"
    assert allowed.status_code == 200 and allowed.json()["input_tokens"] > 0


async def test_readyz_says_which_backends_have_no_key(
    fake: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # policies/default.yaml with no key set: /readyz said "ok" while every request failed with a
    # 500 (MissingCredentials) once its fallbacks were spent (the new-user pass).
    monkeypatch.delenv("ROUTER_TEST_READY_KEY", raising=False)
    keyed = model("keyed", fake.url, api_key_env="ROUTER_TEST_READY_KEY")
    async with serving(tmp_path, [model("open", fake.url), keyed]) as r:
        body = (await r.client.get("/readyz")).json()
        assert body["status"] == "degraded", body
        assert body["missing_credentials"] == [
            "ROUTER_TEST_READY_KEY is not set: keyed cannot be called until it is (requests fall over to other models)"
        ]
        monkeypatch.setenv("ROUTER_TEST_READY_KEY", "sk-test")
        body = (await r.client.get("/readyz")).json()
        assert body["status"] == "ok" and body["missing_credentials"] == [], body
