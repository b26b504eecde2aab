"""A policy reload in the middle of a request: the request keeps the runtime it was admitted with."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.app.factory import Services
from router.fakeupstream import FakeUpstream
from router.policy.active import load_active_policy
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration


def test_a_reload_mid_stream_leaves_the_request_on_its_own_policy(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, tmp_path: Path
) -> None:
    policy = local_policy(upstream.url)
    large = next(m for m in policy["models"] if m["id"] == "local-large")
    # The stream pauses after its first delta: the reload lands while the request is in flight.
    large["litellm_model"] = "openai/large-model@stall_after=1,stall_ms=1500,chunks=4"
    reloaded = copy.deepcopy(policy)
    reloaded["name"] = "reloaded"
    for m in reloaded["models"]:
        m["prices"] = {k: v * 10 for k, v in m["prices"].items()}
    path = tmp_path / "reloaded.yaml"
    path.write_text(yaml.safe_dump(reloaded))
    held: dict[str, Services] = {}
    upstream.clear()
    router = router_factory(policy, services_hook=lambda s: held.setdefault("s", s))
    body = {"model": "local-large", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with (
        httpx.Client(base_url=router.url, timeout=20) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert any(line.startswith("data: {") and '"content"' in line for line in lines)
        held["s"].runtime.install(load_active_policy(path))
        rest = list(lines)
    assert "data: [DONE]" in rest
    rec = router.records(1)[0]
    assert (rec["status"], rec["error_type"], rec["chosen_model"]) == (200, None, "local-large")
    assert rec["policy"].startswith("local-demo/")
    price: dict[str, Any] = large["prices"]
    read = rec["cache_read_tokens"] or 0
    paid = (rec["input_tokens"] - read, rec["output_tokens"], read)
    expected = sum(n * price[k] for n, k in zip(paid, ("input", "output", "cache_read"), strict=True)) / 1e6
    assert rec["cost_usd"] == pytest.approx(expected)  # the old prices: the request's own runtime
    # The next request is decided and accounted by the new runtime.
    with httpx.Client(base_url=router.url, timeout=20) as c:
        body["stream"] = False
        del body["stream_options"]
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    assert router.records(2)[1]["policy"].startswith("reloaded/")
