"""The app factory: settings → services → ASGI app (FastAPI behind a direct proxy path). No module globals.

Everything a request needs hangs off one ``Services`` object built here and kept on
``app.state.services``; the lifespan opens the store, the writer and the HTTP pool, and at
shutdown drains in-flight work and flushes the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI

from router.app.asgi import RouterApp
from router.app.settings import Settings
from router.background import BackgroundTasks
from router.features.memo import Transcripts
from router.features.promptsize import PromptSizer
from router.features.task.tracker import TaskTracker
from router.features.tokens import TokenCounter
from router.forward.execute import Executor
from router.forward.upstream import Upstream
from router.http import admission
from router.http.auth import Auth
from router.learning.guard import Guard
from router.policy.catalog import Catalog
from router.policy.config import Policy
from router.policy.decide import Decider
from router.policy.revisions import Archive
from router.policy.runtime import PolicyHistory, PolicyWatcher, Runtime, load_runtime
from router.state import SharedState, StateConfig, open_state
from router.store import Store, open_store
from router.store.writer import LogWriter
from router.telemetry import Telemetry, build_telemetry
from router.ui import register_ui

log = logging.getLogger("router.app.factory")


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    counter: TokenCounter
    sizer: PromptSizer
    upstream: Upstream
    executor: Executor
    store: Store
    writer: LogWriter
    auth: Auth
    state: SharedState
    history: PolicyHistory
    telemetry: Telemetry = field(default_factory=Telemetry)
    tasks: BackgroundTasks = field(default_factory=BackgroundTasks)
    tracker: TaskTracker = field(default_factory=TaskTracker)
    draining: bool = False

    # Each request reads these once; a policy reload swaps the whole runtime in one assignment.
    @property
    def policy(self) -> Policy:
        return self.runtime.policy

    @property
    def catalog(self) -> Catalog:
        return self.runtime.catalog

    @property
    def decider(self) -> Decider:
        return self.runtime.decider

    def install(self, runtime: Runtime) -> None:
        self.executor.use(runtime.catalog)
        self.runtime = runtime


def build_services(settings: Settings) -> Services:
    """Validate everything that can be validated before the server starts listening."""
    runtime = load_runtime(settings.config)
    history = PolicyHistory(Archive(settings.config))
    history.applied(runtime)
    counter = TokenCounter()
    upstream = Upstream(settings.timeouts)
    store = open_store(settings.store)
    t = settings.redis_timeout_s
    state_config = StateConfig(
        prefix=settings.redis_prefix, op_timeout_s=t, socket_timeout_s=t / 2, connect_timeout_s=t / 2,
        pool_size=64, pool_timeout_s=t / 2,
    )  # fmt: skip
    state = open_state(settings.redis_url, state_config)
    return Services(
        settings=settings,
        runtime=runtime,
        counter=counter,
        sizer=PromptSizer(counter, Transcripts(settings.transcript_memory_bytes)),
        upstream=upstream,
        executor=Executor(upstream, runtime.catalog, settings.timeouts, breakers=state.breakers),
        store=store,
        writer=LogWriter(store),
        auth=Auth(settings.master_key, store),
        state=state,
        history=history,
        telemetry=build_telemetry(settings),
        tracker=TaskTracker(settings.max_tasks),
    )


def create_app(settings: Settings | None = None, services: Services | None = None) -> RouterApp:
    s = services or build_services(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await s.store.open()
        task_budgets = s.policy.spec.objective.max_cost_per_task is not None
        await admission.restore_spend(s.state, s.store, task_budgets)
        await s.auth.start()
        await s.upstream.start()
        s.writer.start(s.tasks)
        watcher = PolicyWatcher(s.settings.config, s.install, s.runtime, s.history)

        async def reload() -> None:
            await asyncio.to_thread(watcher.check, s.runtime)

        async def promoted(version: str) -> None:
            # A promotion or rollback published by another replica: reload now, not at the next poll.
            await reload()

        guard = Guard(s.store, s.history, s.state.policy.publish_version, reload)
        # Loaded once serving, not before: seconds off every start (and restart after a crash).
        # A request that needs them first waits for them: the encoding (a second) to size
        # prompts, litellm (several) for cross-protocol calls only.
        encoding = s.tasks.spawn_blocking(s.counter.count_text, "load the encoding", name="load-encoding")
        if s.settings.preload:
            await asyncio.gather(encoding, s.upstream.prepare_translation())
        else:
            s.tasks.spawn(s.upstream.prepare_translation(), name="load-litellm")
        watching = [
            s.tasks.spawn(watcher.run(lambda: s.runtime), name="policy-watcher"),
            s.tasks.spawn(s.state.policy.watch(promoted), name="policy-version"),
            s.tasks.spawn(guard.run(lambda: s.runtime), name="policy-guard"),
        ]
        if not await s.state.ping():
            log.warning("shared state unreachable at startup: running degraded (see /readyz)")
        log.info("router ready: policy %s (%d models), store %s", s.policy.source, len(s.catalog.backends),
                 s.settings.store.split("://", 1)[0])  # fmt: skip
        try:
            yield
        finally:
            s.draining = True
            for task in watching:
                task.cancel()
            await s.writer.close(s.settings.drain_timeout)
            await s.tasks.drain(s.settings.drain_timeout)
            await s.upstream.close()
            await s.store.close()
            await s.state.aclose()
            s.telemetry.close()

    # /openapi.json is served by router.http.api, behind auth.
    app = FastAPI(
        title="router", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.services = s
    from router.http.api import register
    from router.http.proxy import Proxy

    proxy = Proxy(s)
    register(app, s, proxy)
    register_ui(
        app,
        store=s.store,
        auth=s.auth,
        runtime=lambda: s.runtime,
        history=s.history,
        config=s.settings.config,
    )
    return RouterApp(app, proxy)
