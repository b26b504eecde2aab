"""A translated call to an Anthropic backend asks for no more output than the window leaves."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration

MODEL = "claude-sonnet-4-5"  # litellm's map: 64,000 output tokens at most
WINDOW = 20_000


def policy(up: str) -> dict[str, Any]:
    claude = {"id": "claude", "litellm_model": f"anthropic/{MODEL}", "protocol": "anthropic", "api_base": up,
              "context_window": WINDOW, "max_output_tokens": 64_000, "prices": {"input": 3.0, "output": 15.0}}  # fmt: skip
    return {
        "version": 1,
        "name": "room",
        "models": [claude],
        "routes": [{"match": "auto", "passthrough": "claude"}],
    }


#: Short words, a token each: the router's estimate for Claude (o200k's count x 1.2) is above the
#: fake's count (a token per 4 bytes), as an estimate that fits must be.
WORDS = ("the", "cat", "sat", "and", "ran", "far", "but", "not", "yet", "one", "day", "she", "saw", "him")


def prompt(words: int) -> str:
    rnd = random.Random(words)
    return " ".join(rnd.choice(WORDS) for _ in range(words))


def test_a_translated_call_without_a_limit_asks_for_what_the_window_leaves(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """Chat Completions and Responses clients need not name an output limit; Anthropic needs one,
    and the router gave litellm's largest for the model (64,000 here, as for Sonnet 4 on Bedrock
    in a window of 200,000), which Anthropic's models before Claude 4.5 refuse when it and the
    prompt overflow the window (the fake refuses so for any model): a prompt of ~4,000 of the
    provider's tokens in a window of 20,000 failed with 400. Now the limit is what the window
    leaves after the router's estimate of the prompt (~4,800 tokens) and a margin."""
    upstream.set_behaviour(MODEL, context_window=WINDOW, window_holds_output=True)
    r = router_factory(policy(upstream.url))
    long, short = prompt(4000), "hi"
    bodies = [
        ("/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": long}]}),
        ("/v1/responses", {"model": "auto", "input": long}),
        ("/v1/chat/completions", {"model": "auto", "messages": [{"role": "user", "content": short}]}),
    ]
    upstream.clear()
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for path, body in bodies:
            for stream in (False, True):
                resp = c.post(path, json={**body, "stream": stream})
                assert resp.status_code == 200 and '"error"' not in resp.text, (path, stream, resp.text)
    asked = [req["body"]["max_tokens"] for req in upstream.requests()]
    assert len(asked) == 6
    assert all(10_000 < n < WINDOW - 4000 for n in asked[:4]), asked  # room for a reply, inside the window
    assert all(n > WINDOW - 1000 for n in asked[4:]), asked  # a short prompt leaves more


def test_a_limit_past_the_window_reaches_a_model_that_stops_at_its_window(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """Agents ask for the model's largest output (64,000) whatever the prompt. Claude Sonnet 4.5 and later
    serve a prompt and a limit that overflow the window, stopping at it (``stop_reason:
    "model_context_window_exceeded"``; the fake with a window and no ``window_holds_output`` takes
    them the same way), yet the router refused the call with its own 400: ~4,800 prompt + 64,000
    output tokens > window 20,000. A model before Claude 4.5 is still refused it, in Anthropic's shape."""
    old = "claude-sonnet-4-20250514"
    upstream.set_behaviour(MODEL, context_window=WINDOW)
    upstream.set_behaviour(old, context_window=WINDOW, window_holds_output=True)
    spec = policy(upstream.url)
    spec["models"].append({**spec["models"][0], "id": "old", "litellm_model": f"anthropic/{old}"})
    spec["routes"].append({"match": "old", "passthrough": "old"})
    r = router_factory(spec)
    body = {"max_tokens": 64_000, "messages": [{"role": "user", "content": prompt(4000)}]}
    upstream.clear()
    with httpx.Client(base_url=r.url, timeout=30) as c:
        for stream in (False, True):
            resp = c.post("/v1/messages", json={**body, "model": "auto", "stream": stream})
            assert resp.status_code == 200 and '"error"' not in resp.text, (stream, resp.text)
        refused = c.post("/v1/messages", json={**body, "model": "old"})
    # Sent as the client sent it: the model stops at the window.
    assert [req["body"]["max_tokens"] for req in upstream.requests()] == [64_000, 64_000]
    assert refused.status_code == 400, refused.text
    error = refused.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "64000 output tokens > window 20000" in error["error"]["message"]
