"""Shared plumbing: the overall deadline, error mapping around litellm calls, SSE frame bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson

from router.forward.translate.target import Target
from router.forward.translate.upstream_errors import to_router_error
from router.protocols.sse import close_quietly

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


async def frames(
    source: AsyncIterator[T],
    target: Target,
    deadline: float,
    render: Callable[[T], bytes | None],
    last: bytes | None = None,
) -> AsyncIterator[bytes]:
    """Render an upstream stream as SSE frames under the deadline.

    One generator does it all so that closing it early closes the upstream at once, and every
    failure, the upstream's or a rendering one, leaves as a router error.
    """
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await anext(source)
            except StopAsyncIteration:
                break
            frame = render(item)
            if frame is not None:
                yield frame
        if last is not None:
            yield last
    except Exception as exc:
        raise to_router_error(exc, target) from None
    finally:
        await close_quietly(source)


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
