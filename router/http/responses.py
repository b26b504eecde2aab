"""The proxy's two replies as ASGI messages, a whole one and a stream: each runs what accounts for its
request once it has been sent, however that ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import Response


class WholeReply(Response):
    """A whole reply; ``then`` runs once it has been sent, or failed to be."""

    then: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.then is not None:
                self.then()


class StreamedReply(Response):
    """A streamed reply, sent as raw ASGI messages, accounted for however it ends.

    Starlette's StreamingResponse watches for the client leaving with an anyio task group per
    response, which cost more CPU than relaying the 20 events of a typical stream. Here one
    waiting ``receive()`` does the watching and cancels the sender when the client goes.
    """

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        on_close: Callable[[], Awaitable[None]],
        media_type: str,
        headers: Mapping[str, str],
    ) -> None:
        self.body_iterator = content
        self._on_close = on_close
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sender = asyncio.current_task()
        finished = False

        def client_left(watch: asyncio.Future[Any]) -> None:
            if not finished and not watch.cancelled() and sender is not None:
                sender.cancel()

        watch = asyncio.ensure_future(_disconnected(receive))
        watch.add_done_callback(client_left)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            # Cancelled because the client left: that ends this response, not the server.
            if not watch.done() or watch.cancelled():
                raise
            if sender is not None:
                sender.uncancel()
        except OSError:
            pass  # the connection broke under a write: the client is gone too
        finally:
            finished = True
            watch.remove_done_callback(client_left)
            watch.cancel()
            await self.body_iterator.aclose()
            await self._on_close()


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
