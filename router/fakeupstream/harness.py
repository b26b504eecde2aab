"""``FakeUpstream``: the fake upstream on a background thread, for tests and demos."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

from router.fakeupstream import behaviour as bh
from router.fakeupstream.server import FakeServer, create_app, server_of

T = TypeVar("T")
_TIMEOUT = 10.0
#: How long stopping waits for requests still in flight (a stalled stream must not hang a test).
_SHUTDOWN_S = 1.0


class FakeUpstream:
    """Runs the fake upstream on its own event loop in a daemon thread::

        with FakeUpstream() as up:
            client = OpenAI(base_url=up.url + "/v1", api_key="x")

    Every method that reads or changes server state runs on the server's loop, so the state
    needs no locks and is never seen half-updated.
    """

    def __init__(
        self,
        default: bh.Behaviour | None = None,
        per_model: Mapping[str, bh.Behaviour] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._default = default
        self._per_model = per_model
        self._app: web.Application | None = None
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    @property
    def _server(self) -> FakeServer:
        if self._app is None:
            raise RuntimeError("FakeUpstream is not running")
        return server_of(self._app)

    def __enter__(self) -> FakeUpstream:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("FakeUpstream is already running")
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # handed to the starting thread
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            # Handlers still sleeping past the shutdown grace (a long ttft_ms) end here, not as
            # "Task was destroyed but it is pending" noise when the loop closes.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="fake-upstream", daemon=True)
        self._thread.start()
        started.wait(_TIMEOUT)
        if failure or not self.url:
            self._thread.join(_TIMEOUT)
            self._thread = None
            raise RuntimeError("fake upstream failed to start") from (failure[0] if failure else None)

    async def _start_site(self) -> None:
        # A fresh app per start: an aiohttp app is frozen once it has run.
        self._app = create_app(self._default, self._per_model)
        self._runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=_SHUTDOWN_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(_TIMEOUT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_TIMEOUT)
        self._thread = None
        self._runner = None

    def _call(self, fn: Callable[[], T]) -> T:
        if self._loop is None or self._thread is None:
            raise RuntimeError("FakeUpstream is not running")

        async def on_loop() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result(_TIMEOUT)

    def requests(self) -> list[dict[str, Any]]:
        """The recorded requests, oldest first (the last 1000)."""
        return self._call(self._server.recorder.snapshot)

    def clear(self) -> None:
        self._call(self._server.recorder.clear)

    def open_streams(self) -> int:
        """Streamed replies still being written (one whose client left ends at its next write)."""
        return self._call(lambda: self._server.open_streams)

    def set_behaviour(self, model: str, **fields: Any) -> None:
        """Set ``model``'s behaviour (no fields clears it); raises ``BehaviourError`` for bad fields."""
        overrides = bh.validate(fields)
        self._call(lambda: self._server.set_behaviour(model, overrides))
