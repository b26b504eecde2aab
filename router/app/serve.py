"""Running the app under uvicorn, with a drain that load balancers can see.

On SIGTERM the router first reports not-ready (``/readyz`` 503) for ``drain_delay`` seconds, so
a load balancer stops sending new work; then uvicorn stops listening, lets in-flight requests
and streams finish (up to ``drain_timeout``), and the app's lifespan flushes the log. A second
signal skips the grace period.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import threading
from types import FrameType
from typing import Any

import uvicorn

from router.app.factory import Services, create_app
from router.app.limits import GuardedHttpTools
from router.app.settings import Settings
from router.errors import ConfigError
from router.store import open_store

log = logging.getLogger("router.app.serve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, services: Services, delay: float) -> None:
        super().__init__(config)
        self.services = services
        self.delay = delay

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # Everything loaded so far (litellm alone is ~400k objects) lives as long as the process:
        # without this, each full collection walks it all, a pause of ~250 ms in the middle of
        # whatever requests are in flight. Frozen, collections only look at what requests made.
        gc.collect()
        gc.freeze()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Ctrl-C (SIGINT) means now; SIGTERM (an orchestrator) gets the grace period.
        if self.services.draining or self.delay <= 0 or sig != signal.SIGTERM:
            self.services.draining = True
            super().handle_exit(sig, frame)
            return
        self.services.draining = True
        log.info("draining: /readyz now 503; closing the listener in %.1fs", self.delay)
        threading.Timer(self.delay, super().handle_exit, (sig, frame)).start()


def uvicorn_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """How the router is served: its limits on clients (``router.app.limits``) and the drain."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        http=GuardedHttpTools.with_limits(settings.limits),
        timeout_keep_alive=int(settings.limits.keep_alive_s),
        timeout_graceful_shutdown=int(settings.drain_timeout) or None,
        **options,
    )


def check_port_free(host: str, port: int) -> None:
    """Say now, in one line, that the address is taken: uvicorn finds out only after start-up
    (the policy loaded, "router ready" printed) and then logs three lines and exits with 3."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}"
                " (another router? --port or ROUTER_PORT)"
            ) from None


def check_store(url: str) -> None:
    """Say now, in one line, that the log store cannot be opened (a database that does not
    answer or refuses, a path that cannot hold one): from the app's start-up, uvicorn prints it as
    a 20-line traceback and "Application startup failed". Opened and closed again here: the app
    opens its own on uvicorn's event loop."""

    async def probe() -> None:
        store = open_store(url)
        await store.open()
        await store.close()

    asyncio.run(probe())


def serve(settings: Settings, log_level: str = "info") -> None:
    app = create_app(settings)  # a policy file's error first: it names what to fix
    check_port_free(settings.host, settings.port)
    check_store(settings.store)
    # log_config=None: uvicorn's loggers go through the process's handler (router.app.logs).
    config = uvicorn_config(app, settings, log_level=log_level, log_config=None)
    DrainingServer(config, app.state.services, settings.drain_delay).run()
