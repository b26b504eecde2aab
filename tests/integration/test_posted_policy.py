"""A policy posted for preview (``POST /v1/policy/preview``, the ``/ui/policy`` form) is the caller's
text: it is never interpolated from the router's environment, and it reads no file outside the
running policy's directory, so neither a key nor a file's hash can be read back through it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

MASTER = "posted-policy-master-key"
SECRET = "sk-provider-secret-4b1d9e"
AUTH = {"authorization": f"Bearer {MASTER}"}


@pytest.fixture
def served(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> RunningRouter:
    # The router's own environment: a provider key and the master key, as an operator exports them.
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ROUTER_MASTER_KEY", MASTER)
    return router_factory(local_policy(upstream.url), master_key=MASTER)


def post(r: RunningRouter, policy: dict[str, object]) -> httpx.Response:
    with httpx.Client(base_url=r.url, timeout=30) as c:
        return c.post("/v1/policy/preview", content=yaml.safe_dump(policy), headers=AUTH)


def leaked(reply: httpx.Response) -> bool:
    return SECRET in reply.text or MASTER in reply.text


def test_a_posted_policy_never_reads_the_routers_environment(
    served: RunningRouter, upstream: FakeUpstream
) -> None:
    base = local_policy(upstream.url)
    named = post(served, {**base, "name": "${OPENAI_API_KEY}"})
    master = post(served, {**base, "name": "${ROUTER_MASTER_KEY}"})
    # A variable in a field that fails validation came back in the error message.
    in_error = post(served, {**base, "defaults": {"expected_output_tokens": "${OPENAI_API_KEY}"}})
    for reply in (named, master, in_error):
        assert reply.status_code == 400 and not leaked(reply), reply.text
        assert reply.json()["error"]["code"] == "invalid_policy"
    assert "a posted policy is not read with the router's environment" in named.json()["error"]["message"]

    # A default still applies, so the shipped policies (${ROUTER_LOCAL_UPSTREAM:-...}) preview as before.
    with_default = post(served, {**base, "name": "${OPENAI_API_KEY:-previewed}"})
    assert with_default.status_code == 200, with_default.text
    assert not leaked(with_default) and "previewed" in with_default.text


@pytest.mark.parametrize("field", ["learned", "label_model", "control"])
def test_a_posted_policy_reads_no_file_outside_the_policys_directory(
    served: RunningRouter, upstream: FakeUpstream, tmp_path: Path, field: str
) -> None:
    # A file's hash was an oracle: the pin's mismatch message named the hash the file has.
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": true}')
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    ref = {"artifact": str(outside), "sha256": "0" * 64}
    policy = local_policy(upstream.url)
    if field == "learned":
        policy["learned"] = ref
    elif field == "label_model":
        policy["tasks"] = {**policy.get("tasks", {}), "label_model": ref}
    else:
        policy["control"] = {"share": 0.1, "policy": "../" * 12 + str(outside).lstrip("/")}
    reply = post(served, policy)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "outside the policy's directory" in message and digest not in message
