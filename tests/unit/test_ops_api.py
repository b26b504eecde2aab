"""The ops API's answers to bad input: 400 in the same error shape as every other endpoint."""

from __future__ import annotations

from pathlib import Path

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
