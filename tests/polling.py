"""Waiting for a condition instead of sleeping: poll it, with a bound, and fail clearly at the bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], within: float = 5.0, what: str = "the condition") -> T:
    """Return ``condition()``'s first truthy value; raise ``AssertionError`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {within:g}s")
        time.sleep(0.01)


async def eventually(
    condition: Callable[[], Awaitable[T]], within: float = 5.0, what: str = "the condition"
) -> T:
    """``wait_for`` for async conditions, yielding to the event loop between polls."""
    deadline = time.monotonic() + within
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {within:g}s")
        await asyncio.sleep(0.01)
