"""Building blocks for in-process tests of the request path: real catalogs, requests and decisions.

Backends point at the fake provider; a backend's behaviour rides in its model name
(``name@status=503``), and every name is unique so that the fake's per-model failure counts
(``fail_times``) never leak from one test into another.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson

from router.fakeupstream import FakeUpstream
from router.forward.execute import Execution, Executor, RetryBudget
from router.forward.timeouts import Timeouts
from router.forward.upstream import Upstream
from router.policy.catalog import Backend, Catalog, build_catalog
from router.policy.config import Policy, PolicyFile
from router.policy.decide import Decision
from router.protocols import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, WIRES, ClientRequest
from router.shared import BreakerConfig, MemoryState, StateConfig
from router.telemetry.phases import Phases

_names = itertools.count(1)

BODIES: dict[str, dict[str, Any]] = {
    OPENAI_CHAT: {"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
    ANTHROPIC: {"model": "auto", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    OPENAI_RESPONSES: {"model": "auto", "input": "hi"},
}


def unique(behaviour: str = "") -> str:
    """A model name the fake has never seen, with an optional behaviour spec."""
    name = f"m{next(_names)}"
    return f"{name}@{behaviour}" if behaviour else name


def model(
    id: str,
    fake_url: str,
    behaviour: str = "",
    *,
    protocol: str = "openai",
    window: int = 100_000,
    **extra: Any,
) -> dict[str, Any]:
    """A policy's model entry served by the fake; prices are $1/M input and $2/M output.

    ``protocol`` is the backend's: a client protocol it does not speak goes through litellm."""
    prefix = "anthropic" if protocol == "anthropic" else "openai"
    return {
        "id": id,
        "litellm_model": f"{prefix}/{unique(behaviour)}",
        "protocol": protocol,
        # litellm's api_base conventions, which relaying follows too.
        "api_base": fake_url if protocol == "anthropic" else fake_url + "/v1",
        "prices": {"input": 1.0, "output": 2.0},
        "context_window": window,
        "max_output_tokens": 1000,
        **extra,
    }


def policy(*models: dict[str, Any], **fields: Any) -> Policy:
    ids = [m["id"] for m in models]
    spec = {"models": list(models), "routes": [{"match": "*", "candidates": ids}], **fields}
    return Policy(PolicyFile.model_validate(spec), "test-policy")


def catalog(*models: dict[str, Any]) -> Catalog:
    return build_catalog(policy(*models))


def request(protocol: str = OPENAI_CHAT, *, stream: bool = False, **fields: Any) -> ClientRequest:
    body = {**BODIES[protocol], "stream": stream, **fields}
    return WIRES[protocol].parse(orjson.dumps(body))


def decision(*order: str) -> Decision:
    return Decision(decision_id="dec-test", policy="test", order=list(order), candidates=[], reason="test")


def executor(
    upstream: Upstream,
    cat: Catalog,
    *,
    budget: RetryBudget | None = None,
    breaker: BreakerConfig | None = None,
    backoff_s: float = 0.01,
) -> Executor:
    state = MemoryState(StateConfig(breaker=breaker or BreakerConfig()))
    return Executor(
        upstream, cat, upstream.timeouts, breakers=state.breakers, retry_budget=budget, backoff_s=backoff_s
    )


@asynccontextmanager
async def upstream(**timeouts: float) -> AsyncIterator[Upstream]:
    """A started ``Upstream`` (its own connection pool) with these timeouts."""
    up = Upstream(Timeouts(**timeouts))
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def calls(fake: FakeUpstream, backend: Backend) -> list[dict[str, Any]]:
    """The requests the fake recorded for ``backend``, oldest first."""
    return [
        r
        for r in fake.requests()
        if isinstance(r["body"], dict) and r["body"].get("model") == backend.wire_model
    ]


def called(fake: FakeUpstream, cat: Catalog) -> list[str]:
    """The ids of ``cat``'s backends the fake was called for, in order (other tests' calls ignored)."""
    ids = {b.wire_model: b.id for b in cat}
    models = (r["body"].get("model") for r in fake.requests() if isinstance(r["body"], dict))
    return [ids[m] for m in models if m in ids]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def fresh() -> tuple[Phases, Execution]:
    return Phases(), Execution()
