"""Bad input gets a 4xx in the protocol's own error shape, is logged, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
OK_CHAT = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}'


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["message"] and body["error"]["type"]
    return body["error"]


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


CASES = [
    # (path, body, status, openai error type or anthropic error type)
    (CHAT, b"{not json", 400, "invalid_request_error"),
    (CHAT, b"[1, 2]", 400, "invalid_request_error"),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "invalid_request_error"),
    (CHAT, b'{"model": "auto", "messages": "hi"}', 400, "invalid_request_error"),
    (CHAT, b'{"model": "auto", "messages": [{"role": "wizard", "content": "hi"}]}', 400, "invalid_request_error"),
    (CHAT, b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}', 400,
     "invalid_request_error"),
    (CHAT, b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}', 400,
     "invalid_request_error"),
    (CHAT, b'{"model": "gpt-nonexistent", "messages": [{"role": "user", "content": "hi"}]}', 404,
     "invalid_request_error"),
    (MESSAGES, b"{not json", 400, "invalid_request_error"),
    (MESSAGES, b'{"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}', 400,
     "invalid_request_error"),
    (MESSAGES, b'{"model": "nope", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}', 404,
     "not_found_error"),
    (RESPONSES, b'{"model": "auto"}', 400, "invalid_request_error"),
    (RESPONSES, b'{"model": "auto", "input": "hi", "previous_response_id": "resp_1"}', 400,
     "invalid_request_error"),
    # Unknown types reached the backend: "openai backend answered 400: messages: expected a
    # non-empty array". Refused at ingress, naming where they are.
    (RESPONSES, b'{"model": "auto", "input": [{"role": "user", "content": "hi"}, {"type": "bogus"}]}', 400,
     "invalid_request_error"),
    (MESSAGES, b'{"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": '
               b'[{"type": "bogus", "text": "hi"}]}]}', 400, "invalid_request_error"),
    (MESSAGES, b'{"model": "claude-x", "max_tokens": 10, "messages": [{"role": "system", "content": "be brief"}, '
               b'{"role": "user", "content": "hi"}]}', 400, "invalid_request_error"),
    # Content parts of no known type or shape: a chat request's was answered 200 as if it were not
    # there, a malformed image failed in translation; now a 400 naming the part.
    (CHAT, b'{"model": "auto", "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}', 400,
     "invalid_request_error"),
    (CHAT, b'{"model": "auto", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": 5}]}]}',
     400, "invalid_request_error"),
    (RESPONSES, b'{"model": "auto", "input": [{"role": "user", "content": [{"type": "bogus"}]}]}', 400,
     "invalid_request_error"),
    (MESSAGES, b'{"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": '
               b'[{"type": "image"}]}]}', 400, "invalid_request_error"),
    # OpenAI's priority tier costs about twice the catalog's prices, which budgets count: it was
    # forwarded, so a key could spend about twice its budget.
    (CHAT, b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "service_tier": "priority"}', 400,
     "invalid_request_error"),
    (RESPONSES, b'{"model": "auto", "input": "hi", "service_tier": "priority"}', 400, "invalid_request_error"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "kind"), CASES)
def test_bad_input_is_a_protocol_shaped_4xx(
    router: RunningRouter, path: str, body: bytes, status: int, kind: str
) -> None:
    with httpx.Client(base_url=router.url, timeout=10) as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        if path == MESSAGES:
            assert_anthropic_error(r, status, kind)
        else:
            assert assert_openai_error(r, status)["type"] == kind
        assert "Traceback" not in r.text
        # The server keeps serving.
        assert c.post(CHAT, content=OK_CHAT).status_code == 200
    rec = router.records(2)[0]
    assert rec["status"] == status and rec["error_type"]


def test_body_over_the_cap_is_413(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(local_policy(upstream.url), max_body_bytes=10_000)
    big = b'{"model": "auto", "messages": [{"role": "user", "content": "' + b"x" * 20_000 + b'"}]}'
    with httpx.Client(base_url=r.url, timeout=10) as c:
        assert_openai_error(c.post(CHAT, content=big), 413)
        assert_anthropic_error(c.post(MESSAGES, content=big), 413, "request_too_large")
    assert r.records(2)[0]["status"] == 413


def test_prompt_no_candidate_can_hold(router: RunningRouter) -> None:
    huge = "word " * 450_000  # ~450k tokens; the largest window is 400k
    with httpx.Client(base_url=router.url, timeout=30) as c:
        r = c.post(CHAT, json={"model": "auto", "messages": [{"role": "user", "content": huge}]})
    err = assert_openai_error(r, 400)
    assert err["code"] == "context_length_exceeded"
    assert "local-large" in err["message"]


def test_missing_key_variable_is_named(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    policy["routes"] = [{"match": "auto", "passthrough": "local-nano"}]
    policy["rules"] = []
    policy["models"][0]["api_key_env"] = "ROUTER_TEST_SURELY_UNSET_KEY"
    r = router_factory(policy)
    with httpx.Client(base_url=r.url, timeout=10) as c:
        resp = c.post(CHAT, content=OK_CHAT)
    assert resp.status_code == 500
    assert "ROUTER_TEST_SURELY_UNSET_KEY" in resp.json()["error"]["message"]
    assert r.records(1)[0]["error_type"] == "MissingCredentials"


def test_upstream_400_passes_through_without_fallback(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@status=400"
    r = router_factory(policy)
    with httpx.Client(base_url=r.url, timeout=10) as c:
        resp = c.post(CHAT, content=OK_CHAT)
    assert_openai_error(resp, 400)
    assert resp.headers["x-router-model"] == "local-nano"
