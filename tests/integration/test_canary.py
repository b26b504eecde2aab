"""Secrets and privacy canary: unique secrets and a prompt marker go through every path, and come out nowhere.

Canaries: the provider key (in the backends' key variable), a virtual key, a second virtual key
limited to one model, the master key, and a marker in every prompt. Each request path is taken —
success (relayed and translated), fallback after a 500, a stream cut mid-way, and each error
(400 bad input, 404 model, 403 model not allowed, 413, upstream 400, upstream 429), streamed and
not, in all three protocols — and then the log output, the SQLite files, ``/metrics``, the
trace spans, every response body and every response header are searched for the canaries.
The provider key must reach the provider: that is its point.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.fakeupstream.server import fake_organization
from router.http import keys
from router.store.sqlite import SQLiteStore
from router.telemetry import build_telemetry
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

KEY_ENV = "ROUTER_CANARY_PROVIDER_KEY"
CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"


@dataclass
class Canaries:
    provider: str = field(default_factory=lambda: "sk-canary-provider-" + uuid.uuid4().hex)
    master: str = field(default_factory=lambda: "canary-master-" + uuid.uuid4().hex)
    marker: str = field(default_factory=lambda: "CANARYPROMPT" + uuid.uuid4().hex)
    virtual: str = ""
    restricted: str = ""

    def secrets(self) -> dict[str, str]:
        return {"provider key": self.provider, "master key": self.master, "virtual key": self.virtual,
                "restricted key": self.restricted}  # fmt: skip

    def everything(self) -> dict[str, str]:
        return {**self.secrets(), "prompt marker": self.marker}


def backend(id_: str, model: str, protocol: str, base: str) -> dict[str, Any]:
    return {"id": id_, "litellm_model": model, "protocol": protocol, "api_base": base, "api_key_env": KEY_ENV,
            "prices": {"input": 1.0, "output": 2.0}, "context_window": 100_000, "max_output_tokens": 4096,
            "capabilities": {"tools": True}}  # fmt: skip


def canary_policy(up: str) -> dict[str, Any]:
    v1 = up + "/v1"
    models = [
        backend("nano", "openai/nano-model", "openai", v1),
        backend("claude", "anthropic/claude-local", "anthropic", up),
        backend("resp", "openai/large-model", "openai_responses", v1),
        backend("broken", "openai/nano-model@status=500", "openai", v1),
        backend("broken-claude", "anthropic/claude-local@status=500", "anthropic", up),
        backend("limited", "openai/nano-model@status=429", "openai", v1),
        backend("refuses", "openai/nano-model@status=400", "openai", v1),
        backend("cut", "openai/nano-model@break_after=2", "openai", v1),
        backend("cut-claude", "anthropic/claude-local@break_after=2", "anthropic", up),
    ]
    routes = [
        {"match": "ok-openai", "passthrough": "nano"},
        {"match": "ok-claude", "passthrough": "claude"},
        {"match": "ok-resp", "passthrough": "resp"},
        {"match": "fallback", "passthrough": "broken", "fallbacks": ["nano"]},
        {"match": "fallback-claude", "passthrough": "broken-claude", "fallbacks": ["claude"]},
        {"match": "limited", "passthrough": "limited"},
        {"match": "refuses", "passthrough": "refuses"},
        {"match": "cut", "passthrough": "cut"},
        {"match": "cut-claude", "passthrough": "cut-claude"},
    ]
    return {"version": 1, "name": "canary", "models": models, "routes": routes}


def body(path: str, model: str, marker: str, stream: bool, **extra: Any) -> dict[str, Any]:
    text = f"please remember {marker} and answer"
    if path == CHAT:
        out: dict[str, Any] = {"model": model, "messages": [{"role": "system", "content": marker},
                                                            {"role": "user", "content": text}]}  # fmt: skip
    elif path == MESSAGES:
        out = {
            "model": model,
            "max_tokens": 64,
            "system": marker,
            "messages": [{"role": "user", "content": text}],
        }
    else:
        out = {"model": model, "instructions": marker, "input": text}
    return {**out, "stream": stream, **extra}


#: (requested model, what the client should see); every model runs in every protocol, streamed and not.
SCENARIOS = [
    ("ok-openai", "ok"),
    ("ok-claude", "ok"),
    ("ok-resp", "ok"),
    ("fallback", "ok"),
    ("fallback-claude", "ok"),
    ("cut", "ok-or-error-event"),
    ("cut-claude", "ok-or-error-event"),
    ("limited", (429, 503)),  # 503 once the backend's breaker has opened
    ("refuses", 400),
    ("no-such-model", 404),
]


@dataclass
class Seen:
    bodies: list[tuple[int, str]] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)

    def add(self, r: httpx.Response) -> None:
        self.bodies.append((r.status_code, r.text))
        self.headers.append("\n".join(f"{k}: {v}" for k, v in r.headers.multi_items()))

    def errors(self) -> list[str]:
        """Error bodies, and the error events inside streams that failed after their first token."""
        out = [text for status, text in self.bodies if status >= 400]
        for status, text in self.bodies:
            if status == 200:
                out += [line for line in text.splitlines() if '"error":{' in line.replace(" ", "")]
        return out


async def make_keys(db: Path, c: Canaries) -> tuple[str, str]:
    store = SQLiteStore(str(db))
    await store.open()
    try:
        c.virtual, rec = keys.new_key("canary agent")
        await store.create_key(rec)
        c.restricted, limited = keys.new_key("canary limited", models=["ok-openai"])
        await store.create_key(limited)
        return rec.key_id, limited.key_id
    finally:
        await store.close()


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> Iterator[Canaries]:
    c = Canaries()
    monkeypatch.setenv(KEY_ENV, c.provider)
    yield c


def run_every_path(r: RunningRouter, c: Canaries, *, full: bool) -> tuple[Seen, int]:
    """Send the whole matrix; return what the client saw and how many log rows to expect."""
    seen = Seen()
    sent = 0
    protocols = (CHAT, MESSAGES, RESPONSES)
    with httpx.Client(base_url=r.url, timeout=30) as http:
        auth_headers = [{"authorization": f"Bearer {c.virtual}"}, {"x-api-key": c.virtual}]
        for n, (path, stream, (model, expect)) in enumerate(
            (p, s, sc) for p in protocols for s in (False, True) for sc in SCENARIOS
        ):
            if not full and (stream or model not in ("ok-openai", "ok-claude", "refuses")):
                continue
            resp = http.post(path, json=body(path, model, c.marker, stream), headers=auth_headers[n % 2])
            sent += 1
            seen.add(resp)
            if expect == "ok":
                assert resp.status_code == 200, (path, model, stream, resp.text)
            elif expect == "ok-or-error-event":
                assert resp.status_code in (200, 502), (path, model, stream, resp.text)
            else:
                assert resp.status_code in (expect if isinstance(expect, tuple) else (expect,)), (
                    path, model, stream, resp.text,
                )  # fmt: skip
            if stream and resp.status_code == 200:
                assert "text/event-stream" in resp.headers["content-type"]
        key = {"x-api-key": c.virtual}
        for path in protocols:
            # 400: bad input (the marker is in the body); 403: a model the key may not use; 413: too big.
            cases = [
                (body(path, "ok-openai", c.marker, False, temperature=9), key, 400),
                (body(path, "ok-claude", c.marker, False), {"x-api-key": c.restricted}, 403),
                (body(path, "ok-openai", c.marker * 2000, False), key, 413),
            ]
            for payload, headers, status in cases:
                resp = http.post(path, json=payload, headers=headers)
                sent += 1
                seen.add(resp)
                assert resp.status_code == status, (path, status, resp.text)
        # The master key and the side endpoints.
        resp = http.post(CHAT, json=body(CHAT, "ok-openai", c.marker, False), headers={"x-api-key": c.master})
        sent += 1
        seen.add(resp)
        assert resp.status_code == 200
        count = body(MESSAGES, "ok-claude", c.marker, False)
        for extra in (http.post("/v1/messages/count_tokens", json=count, headers=key),
                      http.post("/v1/route", json=body(CHAT, "ok-openai", c.marker, False), headers=key),
                      http.post(CHAT, json=body(CHAT, "ok-openai", c.marker, False))):  # fmt: skip
            seen.add(extra)
        assert extra.status_code == 401
        sent += 1  # the 401 is logged too
        metrics = http.get("/metrics")
        seen.add(metrics)
    return seen, sent


def start(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, c: Canaries, **settings: Any
) -> tuple[RunningRouter, InMemorySpanExporter, tuple[str, str]]:
    spans = InMemorySpanExporter()

    def hook(s: Services) -> None:
        s.telemetry = build_telemetry(trace_prompts=s.settings.trace_prompts, env={}, exporter=spans)

    upstream.clear()
    r = router_factory(canary_policy(upstream.url), services_hook=hook, master_key=c.master,
                       max_body_bytes=50_000, **settings)  # fmt: skip
    ids = asyncio.run(make_keys(r.db_path, c))
    return r, spans, ids


def store_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(db.parent.glob(db.name + "*")))


def assert_absent(where: str, text: str | bytes, canaries: dict[str, str]) -> None:
    data = text.encode() if isinstance(text, str) else text
    for name, value in canaries.items():
        assert value.encode() not in data, f"the {name} leaked into {where}"


def assert_provider_got_its_key(upstream: FakeUpstream, c: Canaries) -> None:
    sent = upstream.requests()
    assert len(sent) >= 10
    for req in sent:
        h = req["headers"]
        assert h.get("x-api-key") == c.provider or h.get("authorization") == f"Bearer {c.provider}", h
        assert_absent(
            "a provider request", str(req), {k: v for k, v in c.secrets().items() if k != "provider key"}
        )


def test_canaries_leak_nowhere(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    canaries: Canaries,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    r, spans, (virtual_id, _) = start(router_factory, upstream, canaries)
    seen, sent = run_every_path(r, canaries, full=True)
    assert_provider_got_its_key(upstream, canaries)
    rows = r.records(sent)
    assert len(rows) >= sent
    assert any(row["key_id"] == virtual_id for row in rows)
    assert {row["status"] for row in rows} >= {200, 400, 401, 403, 404, 413, 429}
    r.stop()  # flushes the log writer and the span processor

    everything = canaries.everything()
    for i, text in enumerate(seen.headers):
        assert_absent(f"response headers #{i}", text, everything)
    for i, (_, text) in enumerate(seen.bodies):
        # A successful reply may quote the prompt back (a model would); errors and metrics may not.
        assert_absent(f"response body #{i}", text, canaries.secrets())
    errors = seen.errors()
    assert len(errors) >= 30
    assert any(status == 200 and "error" in text for status, text in seen.bodies)  # a stream cut short
    for i, text in enumerate(errors):
        assert_absent(f"error #{i}", text, everything)
    metrics = seen.bodies[-1][1]
    assert_absent("/metrics", metrics, everything)
    assert "router_requests_total" in metrics or metrics.startswith("metrics are not enabled")
    assert "master key mode" in caplog.text  # the router's own records are captured
    assert_absent("the log output", caplog.text, everything)
    out, err = capfd.readouterr()
    assert_absent("stdout/stderr", out + err, everything)
    assert_absent("the SQLite store", store_bytes(r.db_path), everything)
    finished = spans.get_finished_spans()
    assert finished
    assert_absent("trace spans", "\n".join(s.to_json() for s in finished), everything)


def test_prompts_are_stored_only_when_the_operator_opts_in(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    canaries: Canaries,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    r, spans, _ = start(router_factory, upstream, canaries, log_prompts=True)
    _, sent = run_every_path(r, canaries, full=False)
    assert_provider_got_its_key(upstream, canaries)
    rows = r.records(sent)
    r.stop()
    stored = [row["prompt"] for row in rows if row["prompt"]]
    assert stored and all(canaries.marker in p for p in stored)
    data = store_bytes(r.db_path)
    assert canaries.marker.encode() in data
    assert_absent("the SQLite store", data, canaries.secrets())
    assert_absent("the log output", caplog.text, canaries.everything())
    # Spans carry prompts only with ROUTER_TRACE_PROMPTS as well.
    assert_absent(
        "trace spans", "\n".join(s.to_json() for s in spans.get_finished_spans()), canaries.everything()
    )
    assert os.environ[KEY_ENV] == canaries.provider


def echo_policy(up: str) -> dict[str, Any]:
    """Backends whose errors quote the provider key back, as some providers do for a key they refused.

    ``late``'s name puts the key across the 300 characters of a provider's message the router keeps
    (44 characters of the fake's words, the name, 16 more): cut before it was redacted, the key's
    first characters were left in the error.
    """
    v1, late = up + "/v1", "nano-" + "x" * 200
    models = [
        backend("refused", "openai/nano-model@status=401,echo_key=1", "openai", v1),
        backend("refused-claude", "anthropic/claude-local@status=401,echo_key=1", "anthropic", up),
        backend("late", f"openai/{late}@status=401,echo_key=1", "openai", v1),
        backend("late-claude", f"anthropic/{late}@status=401,echo_key=1", "anthropic", up),
        backend("broke", "openai/nano-model@error_after=2,echo_key=1", "openai", v1),
        backend("broke-claude", "anthropic/claude-local@error_after=2,echo_key=1", "anthropic", up),
    ]
    return {"version": 1, "name": "echo", "models": models,
            "routes": [{"match": m["id"], "passthrough": m["id"]} for m in models]}  # fmt: skip


def test_a_provider_key_the_backend_echoes_is_redacted_everywhere(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    canaries: Canaries,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    upstream.clear()
    r = router_factory(echo_policy(upstream.url), master_key=canaries.master)
    seen = Seen()
    sent = 0
    with httpx.Client(base_url=r.url, timeout=30, headers={"x-api-key": canaries.master}) as http:
        for path in (CHAT, MESSAGES, RESPONSES):
            for model in ("refused", "refused-claude", "late", "late-claude", "broke", "broke-claude"):
                for stream in (False, True):
                    resp = http.post(path, json=body(path, model, canaries.marker, stream))
                    sent += 1
                    seen.add(resp)
    # The fake did echo the key (so the test can fail), and the router said the backend's words.
    echoed = [req for req in upstream.requests() if "echo_key" in str(req["body"].get("model"))]
    assert echoed
    errors = seen.errors()
    assert any("[redacted]" in text for text in errors)
    assert any("broke" in text and "[redacted]" in text for text in errors)  # a stream's error event
    rows = r.records(sent)
    assert len(rows) >= sent
    r.stop()
    secret = {"provider key": canaries.provider}
    for i, (status, text) in enumerate(seen.bodies):
        assert_absent(f"response body #{i} ({status})", text, secret)
    # Nor any part of it: the 300-character cut once kept the key's first characters.
    start = canaries.provider[:24]
    assert not any(start in text for _, text in seen.bodies)
    assert_absent("the log output", caplog.text, secret)
    assert_absent("the SQLite store", store_bytes(r.db_path), secret)
    assert start.encode() not in store_bytes(r.db_path)
    # Nor what OpenAI quotes of a refused key (its last four characters) and of the account.
    quoted = {
        "the key's last characters": "*" + canaries.provider[-4:],
        "the organization": fake_organization(canaries.provider),
    }
    for i, (status, text) in enumerate(seen.bodies):
        assert_absent(f"response body #{i} ({status})", text, quoted)
    assert_absent("the log output", caplog.text, quoted)
    assert_absent("the SQLite store", store_bytes(r.db_path), quoted)


def keyless_router(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, providers: Iterable[str]
) -> RunningRouter:
    """A router with one backend per litellm provider, each naming no ``api_key_env``, reached by
    its provider's name as the model and all calling the fake upstream as OpenAI."""
    models = [
        {**backend(p, f"{p}/some-model", "openai", upstream.url + "/v1"), "api_key_env": None}
        for p in providers
    ]
    routes = [{"match": p, "passthrough": p} for p in providers]
    upstream.clear()
    return router_factory({"version": 1, "name": "keyless", "models": models, "routes": routes})


#: litellm providers that speak OpenAI's wire format and, finding no key of their own, fell back
#: to the process's OPENAI_API_KEY (four of the twenty-five that did).
KEYLESS_PROVIDERS = ("perplexity", "deepinfra", "nvidia_nim", "litellm_proxy")


def test_a_backend_without_a_key_is_never_sent_another_providers_key(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    canaries: Canaries,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend that names no ``api_key_env`` is called without a key on the translated path too.
    litellm's OpenAI-compatible providers sent the OpenAI key of the router's environment to
    whichever address the backend had (or to the provider itself, without an ``api_base``)."""
    monkeypatch.setenv("OPENAI_API_KEY", canaries.provider)
    r = keyless_router(router_factory, upstream, KEYLESS_PROVIDERS)
    with httpx.Client(base_url=r.url, timeout=30) as http:
        for p in KEYLESS_PROVIDERS:
            for path in (MESSAGES, RESPONSES):  # translated to Chat Completions by litellm
                resp = http.post(path, json=body(path, p, canaries.marker, False))
                assert resp.status_code == 200, (p, path, resp.text)
    sent = upstream.requests()
    assert len(sent) == 2 * len(KEYLESS_PROVIDERS)
    for i, req in enumerate(sent):
        assert_absent(f"provider request #{i}", str(req), {"OpenAI key": canaries.provider})


#: litellm providers that read their own key variable from the process when given no key, each
#: with that variable: ``anthropic_text`` (Anthropic's text-completions API) and some that speak
#: OpenAI's wire format (eight of the 86 that did).
ENV_KEY_PROVIDERS = {
    "anthropic_text": "ANTHROPIC_API_KEY",
    "groq": "GROQ_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "xai": "XAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "together_ai": "TOGETHER_API_KEY",
    "fireworks_ai": "FIREWORKS_API_KEY",
    "mistral": "MISTRAL_AZURE_API_KEY",
}


def test_a_backend_without_a_key_is_never_sent_its_providers_key_from_the_environment(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keyless backend on a provider whose variable the operator has set (for another backend,
    or for another program) is still called without a key: litellm, given none, read the
    provider's variable and sent it to the backend's address."""
    secrets = {var: f"sk-canary-{p}-{uuid.uuid4().hex}" for p, var in ENV_KEY_PROVIDERS.items()}
    for var, value in secrets.items():
        monkeypatch.setenv(var, value)
    r = keyless_router(router_factory, upstream, ENV_KEY_PROVIDERS)
    with httpx.Client(base_url=r.url, timeout=30) as http:
        for p in ENV_KEY_PROVIDERS:
            resp = http.post(MESSAGES, json=body(MESSAGES, p, "marker", False))
            # The fake speaks no text-completions API: anthropic_text's call is refused, and recorded.
            assert resp.status_code == (200 if p != "anthropic_text" else 404), (p, resp.text)
    sent = upstream.requests()
    assert {req["path"] for req in sent} == {"/v1/chat/completions", "/v1/v1/complete"}
    assert len(sent) == len(ENV_KEY_PROVIDERS)
    for i, req in enumerate(sent):
        assert_absent(f"provider request #{i}", str(req), secrets)


def test_a_key_pasted_where_a_model_goes_is_not_kept_in_the_log(
    router_factory: Callable[..., RunningRouter],
    upstream: FakeUpstream,
    canaries: Canaries,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that sends a key as its model name (a provider's ``sk-…``, or its router key in
    the wrong field) is told the model is unknown in words it can read, its own; the log output,
    the stored log and the spans kept it in plain text (the requested model and the 404's message,
    found by a hostile probe), for anyone who reads the log or the dashboard."""
    caplog.set_level(logging.INFO)
    r, spans, _ = start(router_factory, upstream, canaries)
    pasted = {
        "provider key": "sk-proj-" + uuid.uuid4().hex + uuid.uuid4().hex,
        "virtual key": canaries.virtual,
    }
    for path in (CHAT, MESSAGES, RESPONSES):
        for key in pasted.values():
            resp = httpx.post(r.url + path, json=body(path, key, "hello", False), headers={"x-api-key": canaries.master},
                              timeout=20)  # fmt: skip
            assert resp.status_code == 404, resp.text
    rows = r.records(6)
    assert len(rows) == 6 and all(row["requested_model"] == "[redacted]" for row in rows)
    r.stop()
    assert "[redacted]" in caplog.text
    assert_absent("the log output", caplog.text, pasted)
    assert_absent("the SQLite store", store_bytes(r.db_path), pasted)
    assert_absent("trace spans", "\n".join(s.to_json() for s in spans.get_finished_spans()), pasted)
