"""An open router as docker-compose.yml runs it, behind deploy/nginx.conf: which names it answers.

There is no Docker engine here: the replicas are real routers on uvicorn, sent the ``Host`` that
nginx.conf's ``proxy_set_header Host`` passes on for the browser's or agent's own, and given the
settings the compose file gives them (``ROUTER_ALLOWED_HOSTS`` from ``.env``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
BODY = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def forwarded_host(client_host: str) -> str:
    """The ``Host`` a replica gets from deploy/nginx.conf for a client's ``Host`` header."""
    [value] = re.findall(r"proxy_set_header\s+Host\s+(\S+);", (ROOT / "deploy/nginx.conf").read_text())
    # nginx's $host is the name alone, lower-cased; $http_host the header as the client sent it.
    return {"$host": client_host.rsplit(":", 1)[0].lower(), "$http_host": client_host}[value]


def test_compose_passes_the_allowed_hosts_to_each_replica() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("router-a", "router-b"):
        assert compose["services"][name]["environment"]["ROUTER_ALLOWED_HOSTS"] == "${ROUTER_ALLOWED_HOSTS:-}"


def test_an_open_compose_stack_answers_this_machine_and_the_names_allowed(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """`docker compose up`, then http://127.0.0.1:8080 (the compose file's own instructions) or
    the machine's LAN address is served; the same stack by a LAN name, or by another container as http://lb:8080, is refused
    until ROUTER_ALLOWED_HOSTS names it. The dashboard reached by an allowed name posts its forms
    with Origin http://name:8080: nginx passed the replicas the name without its port ($host), so
    the page was taken for another site's and its policy preview answered 403."""
    upstream.clear()
    policy = local_policy(upstream.url)
    plain = router_factory(policy)
    with httpx.Client(base_url=plain.url, timeout=30) as c:
        for client_host in ("127.0.0.1:8080", "localhost:8080", "192.168.1.20:8080"):
            r = c.post(CHAT, json=BODY, headers={"host": forwarded_host(client_host)})
            assert r.status_code == 200, (client_host, r.text)
        for client_host in ("devbox.lan:8080", "lb:8080"):
            r = c.post(CHAT, json=BODY, headers={"host": forwarded_host(client_host)})
            assert r.status_code == 403 and "ROUTER_ALLOWED_HOSTS" in r.text, (client_host, r.text)
    allowed = router_factory(policy, allowed_hosts="devbox.lan,lb")
    with httpx.Client(base_url=allowed.url, timeout=30) as c:
        for client_host in ("devbox.lan:8080", "lb:8080"):
            r = c.post(CHAT, json=BODY, headers={"host": forwarded_host(client_host)})
            assert r.status_code == 200, (client_host, r.text)
        page = {"host": forwarded_host("devbox.lan:8080"), "origin": "http://devbox.lan:8080"}
        preview = c.post("/ui/policy/preview", data={"yaml": yaml.safe_dump(policy)}, headers=page)
        assert preview.status_code == 200, preview.text[:500]
        # Another site's page is still another site's.
        page["origin"] = "http://evil.example:8080"
        assert c.post("/ui/policy/preview", data={"yaml": "x: 1"}, headers=page).status_code == 403
