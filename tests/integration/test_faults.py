"""The fault matrix: one test per upstream fault, asserting what the client sees and what the log keeps.

Each fault is injected by the local upstream (a behaviour in the backend's model name). ``solo``
routes to the faulty backend alone; ``auto`` has a healthy backend behind it to fall back to.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from router.fakeupstream import FakeUpstream
from router.forward.timeouts import Timeouts
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "hi"}]


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def faulty(
    upstream: FakeUpstream, behaviour: str, protocol: str = "openai", base: str | None = None
) -> dict[str, Any]:
    url = base or upstream.url
    openai_ = protocol != "anthropic"  # Chat Completions or Responses
    api = f"{url}/v1" if openai_ else url
    name = "openai/faulty-model" if openai_ else "anthropic/faulty-claude"
    good = "openai/good-model" if openai_ else "anthropic/good-claude"
    spec = {"protocol": protocol, "context_window": 100000, "max_output_tokens": 4096,
            "prices": {"input": 1.0, "output": 2.0}}  # fmt: skip
    good_base = f"{upstream.url}/v1" if openai_ else upstream.url
    return {
        "models": [
            {
                "id": "faulty",
                "litellm_model": f"{name}@{behaviour}" if behaviour else name,
                "api_base": api,
                **spec,
            },
            {
                "id": "good",
                "litellm_model": good,
                "api_base": good_base,
                **spec,
                "prices": {"input": 2.0, "output": 4.0},
            },
        ],
        "routes": [
            {"match": "solo", "passthrough": "faulty"},
            {"match": "auto", "candidates": ["faulty", "good"]},
            {"match": "claude-*", "candidates": ["faulty", "good"]},
        ],
    }


FAST = Timeouts(connect=1.0, first_token=0.5, idle=0.5, overall=8.0)


def oai(r: RunningRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=r.url + "/v1", api_key="k", max_retries=0, timeout=20)


def post(r: RunningRouter, model: str, **body: Any) -> httpx.Response:
    return httpx.post(
        r.url + "/v1/chat/completions", json={"model": model, "messages": HI, **body}, timeout=20
    )


def last(r: RunningRouter, n: int = 1) -> dict[str, Any]:
    """The n-th request's record (the writer batches, so wait for it)."""
    rec = r.records(n)[n - 1]
    rec["tries"] = json.loads(rec["tries"]) if rec["tries"] else []
    return rec


def test_429_with_retry_after(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "status=429,retry_after=1"), timeouts=FAST)
    t0 = time.monotonic()
    resp = post(r, "solo")
    # The only backend is retried once, after its Retry-After, then the 429 is passed on.
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
    assert time.monotonic() - t0 >= 0.9
    assert resp.json()["error"]["type"] == "rate_limit_error"
    rec = last(r, 1)
    assert [t["status"] for t in rec["tries"]] == [429, 429] and rec["error_type"] == "RateLimited"
    # With another candidate, the router moves on at once.
    resp = post(r, "auto")
    assert resp.status_code == 200 and resp.headers["x-router-model"] == "good"


def test_500_falls_back_and_is_logged(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "status=500"), timeouts=FAST)
    assert post(r, "auto").headers["x-router-model"] == "good"
    assert [t["status"] for t in last(r, 1)["tries"]] == [500, 200]  # what the backend answered
    resp = post(r, "solo")
    assert resp.status_code == 502 and "answered 500" in resp.json()["error"]["message"]


def test_529_overloaded_in_anthropic_shape(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "status=529", protocol="anthropic"), timeouts=FAST)
    c = anthropic.Anthropic(base_url=r.url, api_key="k", max_retries=0, timeout=20)
    with pytest.raises(anthropic.APIStatusError) as exc:
        c.messages.create(model="solo", max_tokens=100, messages=HI)  # type: ignore[arg-type]
    assert exc.value.status_code == 529
    assert exc.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    reply = c.messages.with_raw_response.create(model="claude-x", max_tokens=100, messages=HI)  # type: ignore[arg-type]
    assert reply.headers["x-router-model"] == "good"
    assert last(r, 2)["tries"][0]["error_type"] == "UpstreamOverloaded"


def test_connection_refused(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "", base=f"http://127.0.0.1:{dead_port()}"), timeouts=FAST)
    assert post(r, "auto").headers["x-router-model"] == "good"
    resp = post(r, "solo")
    assert resp.status_code == 502 and "unreachable" in resp.json()["error"]["message"]
    assert last(r, 2)["error_type"] == "UpstreamError"


def test_slow_first_byte_names_the_first_token_timeout(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "ttft_ms=3000"), timeouts=FAST)
    stream = oai(r).chat.completions.with_raw_response.create(model="auto", messages=HI, stream=True)  # type: ignore[arg-type]
    assert stream.headers["x-router-model"] == "good"
    assert last(r, 1)["tries"][0]["error_type"] == "UpstreamTimeout"
    # The one backend of a route is not given up at first_token (no other backend would take the
    # request), but a connection silent for `idle` still is, and retried.
    resp = post(r, "solo", stream=True)
    assert resp.status_code == 504
    assert "idle timeout" in resp.json()["error"]["message"]
    assert [t["error_type"] for t in last(r, 2)["tries"]] == ["UpstreamTimeout"] * 2


def test_stall_mid_stream_is_one_error_event_naming_idle(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "stall_after=2,stall_ms=3000,chunks=6"), timeouts=FAST)
    with httpx.stream("POST", r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI, "stream": True},
                      timeout=20) as resp:  # fmt: skip
        assert resp.status_code == 200
        frames = [line for line in resp.iter_lines() if line.startswith("data: ")]
    errors = [f for f in frames if '"error"' in f]
    assert len(errors) == 1 and "idle timeout" in errors[0]
    assert frames[-1] == errors[0], "the error event is the last thing the client gets"
    rec = last(r)
    assert rec["error_type"] == "UpstreamTimeout" and rec["output_tokens"] is not None


def test_malformed_json_falls_back(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "malformed=1"), timeouts=FAST)
    assert post(r, "auto").headers["x-router-model"] == "good"
    resp = post(r, "solo")
    assert resp.status_code == 502 and "not JSON" in resp.json()["error"]["message"]


def test_truncated_sse_ends_with_an_error_event(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "truncate=1"), timeouts=FAST)
    with pytest.raises(openai.APIError, match="ended the stream"):
        for _ in oai(r).chat.completions.create(model="solo", messages=HI, stream=True):  # type: ignore[arg-type]
            pass
    rec = last(r)
    assert rec["error_type"] == "UpstreamError" and rec["usage_estimated"] == 1


def test_enormous_response_is_delivered_and_logged(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "big_kb=4000"), timeouts=FAST)
    reply = oai(r).chat.completions.create(model="solo", messages=HI)  # type: ignore[arg-type]
    assert len(reply.choices[0].message.content or "") > 3_000_000
    rec = last(r)
    assert rec["status"] == 200 and rec["output_tokens"] > 100_000


def test_connection_closed_mid_body(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    r = router_factory(faulty(upstream, "break_after=2,chunks=10"), timeouts=FAST)
    # Non-streamed: the backend hangs up before a whole reply; the healthy one answers instead.
    assert post(r, "auto").headers["x-router-model"] == "good"
    # Streamed, after the first token: one error event, and the partial usage is logged.
    with pytest.raises(openai.APIError):
        for _ in oai(r).chat.completions.create(model="solo", messages=HI, stream=True):  # type: ignore[arg-type]
            pass
    rec = last(r, 2)
    assert rec["error_type"] == "UpstreamError" and rec["status"] == 200 and rec["output_tokens"] >= 1


def test_client_leaving_mid_stream_stops_the_relay(router_factory, upstream: FakeUpstream) -> None:  # type: ignore[no-untyped-def]
    # 40 deltas 250 ms apart: the whole stream would take 10 s; the record must not wait for it.
    slow = Timeouts(connect=1.0, first_token=5.0, idle=5.0, overall=60.0)
    r = router_factory(faulty(upstream, "chunk_ms=250,chunks=40"), timeouts=slow)
    with httpx.stream("POST", r.url + "/v1/chat/completions", json={"model": "solo", "messages": HI, "stream": True},
                      timeout=20) as resp:  # fmt: skip
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    left = time.monotonic()
    rec = last(r)  # waits up to 5 s for the record
    assert time.monotonic() - left < 5
    assert rec["status"] == 499 and rec["error_type"] == "client_disconnected"
    assert post(r, "auto").status_code == 200, "the router keeps serving"
