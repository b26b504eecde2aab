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
