"""The four timeouts of a backend call, each named in the error it produces.

Connect, first token (prefill included), idle between chunks, and one overall deadline for the whole
request with every fallback. Read from ``ROUTER_TIMEOUTS__*`` as part of the settings.
"""

from __future__ import annotations

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
