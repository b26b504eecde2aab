"""Shared plumbing: the overall deadline, error mapping around litellm calls, SSE frame bytes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import orjson

from router.translate.target import Target
from router.translate.upstream_errors import to_router_error

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def deadline_of(target: Target) -> float:
    """The loop time by which the whole call, stream included, must be over."""
    return asyncio.get_running_loop().time() + target.timeout


async def call(awaitable: Awaitable[T], target: Target, deadline: float) -> T:
    """Await one litellm call under the deadline; anything it raises becomes a router error."""
    try:
        async with asyncio.timeout_at(deadline):
            return await awaitable
    except Exception as exc:
        raise to_router_error(exc, target) from None


async def guarded(source: AsyncIterator[T], target: Target, deadline: float) -> AsyncIterator[T]:
    """Iterate an upstream stream under the deadline, mapping errors; always closes the source."""
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await anext(source)
            except StopAsyncIteration:
                return
            yield item
    except Exception as exc:
        raise to_router_error(exc, target) from None
    finally:
        await _close(source)


async def _close(source: object) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is None:
        return
    # The stream is over either way; a failing close must not mask the real outcome.
    with contextlib.suppress(Exception):
        await aclose()


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_plain)


def plain(obj: Any) -> Any:
    """Litellm's objects (pydantic models, TypedDicts) as plain JSON values."""
    return orjson.loads(dumps(obj))


def _plain(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump(mode="json", exclude_none=True)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def data_frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def event_frame(name: str, payload: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"
