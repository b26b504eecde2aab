"""What operators and clients see of each request: the console lines, the cost in the reply
(``x-router-cost-usd``, ``usage.cost`` in OpenAI streams), the limits on ``/v1/models``, the JSON log."""

from __future__ import annotations

import json
import logging
import re
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy
from tests.integration.test_serve_process import serve_process

pytestmark = pytest.mark.integration

#: The series a metric family of each kind exposes besides its name.
SUFFIXES = {"counter": ("total",), "histogram": ("bucket", "sum", "count"), "info": ("info",)}


def test_console_line_per_request_and_warnings_for_fallbacks_and_breakers(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    policy = local_policy(upstream.url)
    policy["models"][0]["litellm_model"] = "openai/nano-model@status=500"
    r = router_factory(policy)
    caplog.set_level(logging.INFO)
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for i in range(5):  # five failures in a row open local-nano's breaker
            body = {"model": "auto", "messages": [{"role": "user", "content": f"hi {i}"}]}
            assert (
                c.post("/v1/chat/completions", json=body, headers={"x-router-task-id": f"t{i}"}).status_code
                == 200
            )
    rows = r.records(wait_for=5)
    requests = [
        m.getMessage() for m in caplog.records if m.name == "router.requests" and m.levelno == logging.INFO
    ]
    assert len(requests) == 5
    first = rows[0]
    assert requests[0] == (
        f"chat task t0: auto → local-mini ({first['decision_reason']}) 200 "
        f"{first['input_tokens']}/{first['output_tokens']} tok ${first['cost_usd']:.6f} {first['total_ms']:.0f} ms"
    )
    fallbacks = [
        m.getMessage() for m in caplog.records if m.name == "router.requests" and m.levelno == logging.WARNING
    ]
    assert len(fallbacks) == 5 and all(
        "local-nano failed (500 UpstreamError) → local-mini" in f for f in fallbacks
    ), fallbacks
    breakers = [m.getMessage() for m in caplog.records if m.name == "router.breakers"]
    assert breakers == ["breaker for local-nano opened after 5 failures in a row: skipped for 30 s"], breakers
    metrics = httpx.get(r.url + "/metrics").text  # the dashboard's breaker panel reads this
    assert 'router_breaker_state{backend="local-nano",state="open"} 1.0' in metrics
    assert 'router_breaker_state{backend="local-mini",state="closed"} 1.0' in metrics
    # every series the Grafana dashboard queries is one this router exports
    exported = set(re.findall(r"^# TYPE (\S+) (\w+)", metrics, re.M))
    names = {n for n, _ in exported} | {f"{n}_{s}" for n, kind in exported for s in SUFFIXES.get(kind, ())}
    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/router.json").read_text()
    )
    queried = {
        m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"router_\w+", t["expr"])
    }
    assert queried and queried <= names, queried - names


def test_cost_in_the_reply(router: RunningRouter) -> None:
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="k", max_retries=0, timeout=20)
    raw = c.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}]
    )
    header = float(raw.headers["x-router-cost-usd"])
    stream = c.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "hello"}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    final = [ch for ch in stream if ch.usage is not None][-1]
    plain = c.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "no usage asked"}], stream=True
    )
    assert all(ch.usage is None for ch in plain.parse())  # a client that did not ask gets no usage chunk
    assert "x-router-cost-usd" not in plain.headers  # unknown before a stream's headers go out
    rows = router.records(wait_for=3)
    assert header == pytest.approx(rows[0]["cost_usd"], rel=1e-9) and header > 0
    assert (final.usage.model_extra or {})["cost"] == pytest.approx(rows[1]["cost_usd"], rel=1e-9)
    with httpx.Client(base_url=router.url) as h:
        bad = h.post("/v1/chat/completions", json={"model": "auto"})
    assert bad.status_code == 400 and "x-router-cost-usd" not in bad.headers


def test_models_carry_their_limits(router: RunningRouter) -> None:
    with httpx.Client(base_url=router.url) as c:
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert (models["local-nano"]["context_length"], models["local-nano"]["max_output_tokens"]) == (
        16384,
        4096,
    )
    assert models["local-nano"]["max_input_tokens"] == 16384
    # a route offers the largest of its models' limits: the router sends what fits to one that takes it
    assert (models["auto"]["context_length"], models["auto"]["max_output_tokens"]) == (400000, 64000)
    assert models["local-large"]["context_length"] == 400000  # the passthrough route, by the backend's own


def test_serve_log_format_json(tmp_path: Path, upstream: FakeUpstream) -> None:
    proc, base = serve_process(tmp_path, upstream, "--log-format", "json")
    try:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=20).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0].decode()
    lines = []
    for line in out.splitlines():  # every line is JSON
        try:
            lines.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pytest.fail(f"not JSON: {line!r} in\n{out}")
    [request] = [x for x in lines if x.get("event") == "request"]
    assert request["chosen_model"] == "local-nano" and request["status"] == 200 and request["cost_usd"] > 0
    assert any(x["logger"].startswith("uvicorn") for x in lines)  # uvicorn's own lines too
