"""The four timeouts of a backend call, each named in the error it produces.

Connect, first token (prefill included), idle between chunks, and one overall deadline for the whole
request with every fallback. Read from ``ROUTER_TIMEOUTS__*`` as part of the settings.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Timeouts(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    connect: float = Field(default=10.0, gt=0)
    #: From the upstream call to the first byte of the response (prefill included).
    first_token: float = Field(default=300.0, gt=0)
    #: Longest silence between two chunks of a stream.
    idle: float = Field(default=120.0, gt=0)
    #: The whole request, every fallback included.
    overall: float = Field(default=900.0, gt=0)


def gives_up_at_first_token(backend: str, following: Iterable[str]) -> bool:
    """Whether a streamed try of ``backend`` is given up when its first token misses ``first_token``,
    ``following`` being the backends the request may try after it: only when one of them is
    another backend. A try given up is billed (the provider did the prefill and the thinking) and
    its generation lost; when only ``backend`` itself could follow (the last candidate, or its
    retry) the next try buys the same wait again from its start, two tries paid for the one that
    waiting would have served sooner. Such a try is waited for to the ``overall`` deadline."""
    return any(other != backend for other in following)
