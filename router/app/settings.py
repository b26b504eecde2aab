"""Process settings: from CLI flags, else ``ROUTER_*`` environment variables, else defaults.

Everything the app is built from is here, validated once; the app factory takes a ``Settings``
and nothing else reads the environment for configuration (backend keys are read by name, from
the catalog, when a call is made).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from router.app.limits import Limits
from router.errors import ConfigError
from router.forward.timeouts import Timeouts
from router.http.browsers import allowed_hosts
from router.shared.types import HOLD_TTL_S

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def config_given(given: str | None) -> str:
    """The policy file a command reads: ``--config``, else ``ROUTER_CONFIG``, else the default policy
    the router serves (``DEFAULT_CONFIG``): every command reads the same file from any directory."""
    return given or os.environ.get("ROUTER_CONFIG") or str(DEFAULT_CONFIG)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROUTER_", extra="forbid", env_nested_delimiter="__")

    config: Path = DEFAULT_CONFIG
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    store: str = "sqlite:///router.db"
    #: Shared state for several replicas (pins, budgets, rate limits, breakers, policy version).
    #: Unset: everything lives in this process (the embedded default).
    redis_url: str | None = None
    redis_prefix: str = "router:"
    #: Cap on one shared-state call (pool wait + round trip); past it Redis counts as down.
    redis_timeout_s: float = Field(default=1.0, gt=0)
    #: Seconds a budget hold lives unless renewed: how long a crashed replica's holds keep their
    #: keys' and tasks' money from every replica (running requests renew theirs every half of it;
    #: ``HOLD_TTL_S`` says why a minute). Under 10 s a stalled event loop or a Redis blip costs
    #: running requests their holds; over an hour a crash shuts a key out for longer.
    reservation_ttl_s: float = Field(default=HOLD_TTL_S, ge=10, le=3600)
    #: Requests with a larger body are refused with 413 before parsing.
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    #: Memory for the conversations' last requests, so the next turn of a long conversation costs
    #: only its new messages. Counted as request-body bytes: the parsed messages held take a few
    #: times that. 0: every request is sized anew.
    transcript_memory_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: Tasks this process remembers (attempt, pin, failed models, task features: about 4 KB each
    #: for a typical issue); past it the least recently seen task is forgotten (with Redis, its pin
    #: is still shared).
    max_tasks: int = Field(default=100_000, gt=0)
    #: The most logged requests the server reads for one look at a window (a dashboard page,
    #: ``POST /v1/policy/preview``), the latest of them: a busy router logs hundreds of thousands a
    #: day, and the numbers are worked out in this process (~3 KB and ~60 µs of Python a row).
    #: ``router report`` and ``router preview`` read a whole window, in their own process.
    max_window_requests: int = Field(default=20_000, gt=0)
    #: Store prompt text in the log. Off unless the operator opts in.
    log_prompts: bool = False
    #: In open mode, the hosts answered besides localhost and loopback addresses (a request for any
    #: other ``Host`` is refused: a site rebinding its name to this machine): names, ``*.lan`` for a
    #: name's subdomains, ``*`` for any. Comma-separated or a JSON list in ``ROUTER_ALLOWED_HOSTS``.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    #: Master key for the management API and, when set, for the proxy (virtual keys come later).
    master_key: SecretStr | None = None
    timeouts: Timeouts = Timeouts()
    #: What one client may hold of the server: header size and count, read timeouts, connections.
    limits: Limits = Limits()
    #: Write a request's log record before its reply (a stream's before its final event) is sent, so
    #: a hard crash (kill -9) cannot lose an answered request's record; costs a store write per
    #: reply's latency (docs/reliability.md). Off: records are written in batches, up to 0.25 s later.
    durable_log: bool = False
    #: Load litellm (cross-protocol calls) and the tokenizer before serving: the first requests
    #: do not wait for them, and every start takes seconds longer. Off: loaded in the background
    #: once serving (benchmarks of steady-state throughput turn this on).
    preload: bool = False
    #: Seconds to wait for in-flight requests and the log at shutdown.
    drain_timeout: float = Field(default=30.0, ge=0)
    #: Seconds between SIGTERM and closing the listener, with /readyz at 503 meanwhile.
    drain_delay: float = Field(default=2.0, ge=0)
    #: Put prompt text on trace spans. Needs ``log_prompts`` too (only then is the prompt captured).
    trace_prompts: bool = False

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, given: Any) -> Any:
        return allowed_hosts(given) if isinstance(given, str | list | tuple) else given

    @field_validator("master_key", mode="after")
    @classmethod
    def _stripped(cls, key: SecretStr | None) -> SecretStr | None:
        # An env file or a secret mounted from a file ends the key in a newline, which no client
        # sends (HTTP strips a header value's ends): the key the operator handed out never matched.
        value = key.get_secret_value().strip() if key is not None else ""
        return SecretStr(value) if value else None


#: The fields ``router serve`` and ``router check`` take flags for, and the flag's attribute.
FLAGS = {"config": "config", "host": "host", "port": "port", "store": "store", "redis_url": "redis",
         "allowed_hosts": "allowed_hosts"}  # fmt: skip


def from_flags(args: argparse.Namespace) -> Settings:
    """The settings of ``router serve`` and ``router check``: their flags over ``ROUTER_*`` variables."""
    return load(**{f: v for f, attr in FLAGS.items() if (v := getattr(args, attr, None)) is not None})


def load(**given: Any) -> Settings:
    """``Settings`` with ``given`` (from flags, or fixed by a command) over ``ROUTER_*`` variables; a
    value out of range is a ``ConfigError`` naming it and where it came from, in one line."""
    try:
        return Settings(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"])
        field = name.split(".")[0]
        env = "ROUTER_" + name.replace(".", "__").upper()
        source = env if field not in given else "--" + FLAGS.get(field, field).replace("_", "-")
        raise ConfigError(f"{name}: {err['msg']} (set by {source})") from None
