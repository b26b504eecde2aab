"""Schemathesis against the running router's own OpenAPI schema: no 5xx, no hang, no crash, and every
refusal in the protocol's own error shape.

The proxy endpoints read raw bodies, so FastAPI's schema says nothing about them; the test gives
them a request body schema shaped like the three protocols (model, messages, input, limits,
tools...), so that generated cases, valid and invalid, reach the parsers and the routing.
Bounded: a fixed number of examples, each request with a timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, assert_protocol_shaped, local_policy, serving

pytestmark = pytest.mark.integration

_MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
    "required": ["role", "content"],
}
_BODY = {
    "type": "object",
    "properties": {
        "model": {
            "anyOf": [
                {"type": "string", "enum": ["auto", "claude-x", "local-large", "local-claude"]},
                {"type": "string"},
            ]
        },
        "messages": {"type": "array", "items": _MESSAGE, "maxItems": 4},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": _MESSAGE, "maxItems": 3}]},
        "system": {"type": "string"},
        "instructions": {"type": "string"},
        "max_tokens": {"type": "integer"},
        "max_output_tokens": {"type": "integer"},
        "temperature": {"type": "number"},
        "stream": {"type": "boolean"},
        "tools": {"type": "array", "maxItems": 2, "items": {"type": "object"}},
        "task_id": {"type": "string"},
        "success": {"type": "boolean"},
    },
}


def _requiring(*names: str, **limits: Any) -> dict[str, Any]:
    """``_BODY`` with these fields required (so valid cases get past parsing), and tighter limits."""
    props = {k: {**v, **limits.get(k, {})} for k, v in _BODY["properties"].items()}
    return {**_BODY, "properties": props, "required": list(names)}


_PER_PATH = {
    "/v1/chat/completions": _requiring("model", "messages", messages={"minItems": 1}),
    "/v1/messages": _requiring(
        "model",
        "max_tokens",
        "messages",
        max_tokens={"minimum": 1, "maximum": 4096},
        messages={"minItems": 1},
    ),
    "/v1/messages/count_tokens": _requiring("model", "messages", messages={"minItems": 1}),
    "/v1/responses": _requiring("model", "input", max_output_tokens={"minimum": 1, "maximum": 4096}),
    "/v1/outcomes": _requiring("task_id", "success"),
}


def enriched(doc: dict[str, Any]) -> dict[str, Any]:
    """The server's schema with a JSON body described for the POST endpoints that read raw bodies."""
    for path, ops in doc["paths"].items():
        post = ops.get("post")
        if post is not None and "requestBody" not in post:
            schema = _PER_PATH.get(path, _BODY)
            post["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return doc


@pytest.fixture(scope="module")
def served(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRouter]:
    with serving(local_policy(upstream.url), tmp_path_factory.mktemp("schemathesis")) as r:
        yield r


def test_openapi_schema_is_served(served: RunningRouter) -> None:
    doc = httpx.get(served.url + "/openapi.json", timeout=10).json()
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/healthz"} <= set(doc["paths"])


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_server_errors(served: RunningRouter, mode: GenerationMode) -> None:
    doc = enriched(httpx.get(served.url + "/openapi.json", timeout=10).json())
    schema = schemathesis.openapi.from_dict(doc)
    strategy = schema.as_strategy(generation_mode=mode)
    statuses: list[int] = []
    started = time.monotonic()

    @settings(
        max_examples=50,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy)
        response = case.call(base_url=served.url, timeout=15)
        statuses.append(response.status_code)
        note(f"{case.method} {case.path} {case.body!r}")
        assert_protocol_shaped(response.status_code, response.text, case.path)

    run()
    assert len(statuses) >= 20
    assert time.monotonic() - started < 120
    assert httpx.get(served.url + "/healthz", timeout=5).status_code == 200
