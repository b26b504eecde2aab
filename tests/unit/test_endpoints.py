"""``router.http.endpoints.keyed``: every answer of a keyed endpoint is in its protocol's shape."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.testclient import TestClient

from router.http.auth import Auth, Principal
from router.http.endpoints import keyed
from router.protocols import ANTHROPIC


class Broken:
    def __init__(self) -> None:
        self.auth = Auth(None)

    @keyed(ANTHROPIC)
    async def boom(self, request: Request, principal: Principal) -> Response:
        raise KeyError("a bug")


def test_an_unexpected_failure_is_answered_in_the_endpoints_shape() -> None:
    # Found fuzzing /v1/policy/preview (a policy nested too deeply): Starlette's text/plain
    # "Internal Server Error", which no SDK reads.
    app = FastAPI()
    app.add_api_route("/boom", Broken().boom, methods=["GET"])
    r = TestClient(app, base_url="http://localhost", raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500
    assert r.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "internal error in the router"},
    }
    assert "a bug" not in r.text
