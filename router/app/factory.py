"""The assembly: settings → services → ASGI app (FastAPI behind a direct proxy path). No module globals.

``Services`` holds what the process is built from; it is known here and nowhere else: each stage
is handed the collaborators it uses. The lifespan opens the store, the writer and the HTTP pool,
and at shutdown drains in-flight work and flushes the log.
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
from router.background import Background, on_daemon_thread
from router.features.memo import ConversationMemo
from router.features.promptsize import COUNT_NEW_CHARS, PromptSizer
from router.features.task.context import TaskContext
from router.features.task.tracker import TaskTracker
from router.features.tokens import TokenCounter
from router.forward.execute import Executor
from router.forward.upstream import Upstream
from router.http.admission import Admission, restore_spend
from router.http.api import Api
from router.http.auth import Auth
from router.http.browsers import Browsers
from router.http.ops import Metrics, Ops, Probes
from router.http.outcomes import Outcomes
from router.http.proxy import Proxy
from router.http.recorder import Recorder
from router.policy.active import ActivePolicyHolder, PolicyHistory, PolicyWatcher, load_active_policy
from router.policy.collector import PolicyCollector
from router.policy.pipeline import Pipeline
from router.policy.revisions import Archive
from router.rollout.guard import Guard
from router.shared import MemoryState, SharedState, StateConfig, open_state
from router.store import Store, mask_url, open_store
from router.store.writer import LogWriter
from router.telemetry import Telemetry, build_telemetry
from router.telemetry.health import HealthCollector
from router.ui import Dashboard

log = logging.getLogger("router.app.factory")


@dataclass
class Services:
    settings: Settings
    runtime: ActivePolicyHolder
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
    background: Background = field(default_factory=Background)
    tracker: TaskTracker = field(default_factory=TaskTracker)
    draining: bool = False


def build_services(settings: Settings) -> Services:
    """Validate everything that can be validated before the server starts listening."""
    runtime = load_active_policy(settings.config)
    history = PolicyHistory(Archive(settings.config))
    history.applied(runtime)
    counter = TokenCounter()
    upstream = Upstream(settings.timeouts)
    store = open_store(settings.store)
    t = settings.redis_timeout_s
    state_config = StateConfig(
        prefix=settings.redis_prefix, op_timeout_s=t, socket_timeout_s=t / 2, connect_timeout_s=t / 2,
        pool_size=64, pool_timeout_s=t / 2, reservation_ttl_s=settings.reservation_ttl_s,
    )  # fmt: skip
    state = open_state(settings.redis_url, state_config)
    executor = Executor(upstream, runtime.catalog, settings.timeouts, breakers=state.breakers)
    return Services(
        settings=settings,
        runtime=ActivePolicyHolder(runtime, on_install=lambda rt: executor.use(rt.catalog)),
        counter=counter,
        sizer=PromptSizer(
            counter, ConversationMemo(settings.transcript_memory_bytes), count_new_chars=COUNT_NEW_CHARS
        ),
        upstream=upstream,
        executor=executor,
        store=store,
        writer=LogWriter(store),
        auth=Auth(settings.master_key, store, browsers=Browsers(settings.allowed_hosts)),
        state=state,
        history=history,
        telemetry=build_telemetry(trace_prompts=settings.trace_prompts),
        tracker=TaskTracker(settings.max_tasks),
    )


def create_app(settings: Settings | None = None, services: Services | None = None) -> RouterApp:
    s = services or build_services(settings or Settings())
    runtime = s.runtime

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await s.store.open()
        spec = runtime.current.policy.spec
        task_budgets = any(
            o is not None and o.max_cost_per_task is not None
            for o in (spec.objective, *(scope.objective for scope in spec.scopes))
        )
        await restore_spend(s.state, s.store, task_budgets, s.writer)
        await s.auth.start()
        await s.upstream.start()
        s.writer.start(s.background)
        watcher = PolicyWatcher(s.settings.config, runtime.install, runtime.current, s.history)

        async def reload() -> None:
            await asyncio.to_thread(watcher.check, runtime.current)

        async def promoted(version: str) -> None:
            # A promotion or rollback published by another replica: reload now, not at the next poll.
            await reload()

        guard = Guard(s.store, s.history, s.state.policy.publish_version, reload)
        # Loaded once serving, not before: seconds off every start (and restart after a crash).
        # A request that needs them first waits for them: the encoding (a second) to size
        # prompts, litellm (several) for cross-protocol calls only. Stopped at shutdown, not
        # drained, and on daemon threads that the exit does not wait for: they serve requests
        # yet to come (one in flight that needs them loads or awaits them itself; uvicorn drains
        # those before this lifespan ends).
        encoding = s.background.spawn(
            on_daemon_thread(s.counter.count_text, "load the encoding", name="load-encoding", nice=True),
            name="load-encoding",
        )
        if s.settings.preload:
            await asyncio.gather(encoding, s.upstream.prepare_translation())
        until_shutdown = [
            encoding,
            s.background.spawn(s.upstream.prepare_translation(), name="load-litellm"),
            s.background.spawn(watcher.run(lambda: runtime.current), name="policy-watcher"),
            s.background.spawn(s.state.policy.watch(promoted), name="policy-version"),
            s.background.spawn(guard.run(lambda: runtime.current), name="policy-guard"),
        ]
        if not await s.state.ping():
            log.warning("shared state unreachable at startup: running degraded (see /readyz)")
        rt = runtime.current
        # The store's URL, not its kind alone: where the log is, for `router tasks --store` and the
        # rest (the password masked).
        log.info("router ready: policy %s (%d models), store %s", rt.policy.source, len(rt.catalog.backends),
                 mask_url(s.settings.store))  # fmt: skip
        if not s.settings.redis_url and s.settings.store.lower().startswith(("postgresql:", "postgres:")):
            # A shared log suggests replicas; without Redis each counts a key's spend alone (restored
            # from the log only at its start), so N of them allowed a key N times its budget unwarned.
            log.warning(
                "no --redis: budgets and rate limits are this process's own; replicas sharing this store "
                "each allow a key its whole --budget and --rpm/--tpm (give every replica the same --redis)"
            )
        try:
            yield
        finally:
            s.draining = True
            for task in until_shutdown:
                task.cancel()
            await s.writer.close(s.settings.drain_timeout)
            await s.background.drain(s.settings.drain_timeout)
            await s.upstream.close()
            await s.store.close()
            await s.state.aclose()
            s.telemetry.close()

    # /openapi.json is served by router.http.api, behind auth.
    app = FastAPI(
        title="router", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.services = s
    tasks = TaskContext(
        s.tracker, s.state.budgets, s.writer, s.background,
        shared=s.state.sessions if s.settings.redis_url else None,
    )  # fmt: skip
    # In-process budgets recall a forgotten scope's spend from the log; Redis keeps its own.
    admission = Admission(
        s.state.limits, s.state.budgets, s.store if isinstance(s.state, MemoryState) else None
    )
    pipeline = Pipeline(s.sizer, tasks, s.background)
    proxy = Proxy(
        s.auth, pipeline, admission, s.executor,
        Recorder(pipeline, admission, s.writer, s.telemetry, s.background, s.auth.is_master), runtime,
        max_body_bytes=s.settings.max_body_bytes, log_prompts=s.settings.log_prompts,
        durable_log=s.settings.durable_log,
    )  # fmt: skip
    # Each class of handlers holds what its endpoints use; the order of registration is the
    # order of the routes (and of the OpenAPI document).
    Api(
        proxy=proxy, auth=s.auth, counter=s.counter, runtime=runtime, background=s.background,
        describe=app.openapi, max_body_bytes=s.settings.max_body_bytes,
    ).register(app)  # fmt: skip
    Outcomes(
        auth=s.auth, tasks=tasks, store=s.store, runtime=runtime, max_body_bytes=s.settings.max_body_bytes,
    ).register(app)  # fmt: skip
    Probes(
        writer=s.writer, state=s.state, upstream=s.upstream, runtime=runtime, history=s.history,
        draining=lambda: s.draining,
    ).register(app)  # fmt: skip
    Metrics(s.telemetry).register(app)
    Ops(
        auth=s.auth, store=s.store, writer=s.writer, tasks=tasks, runtime=runtime, history=s.history,
        max_body_bytes=s.settings.max_body_bytes, max_window_requests=s.settings.max_window_requests,
    ).register(app)  # fmt: skip
    Dashboard(
        store=s.store, writer=s.writer, auth=s.auth, runtime=lambda: runtime.current, history=s.history, config=s.settings.config,
        max_requests=s.settings.max_window_requests,
    ).register(app)  # fmt: skip
    # Routes are labelled by the policy in force, which a reload may replace.
    s.telemetry.use_policy(lambda: runtime.current.policy)
    registry = getattr(getattr(s.telemetry, "metrics", None), "registry", None)
    if registry is not None:
        registry.register(HealthCollector(s.state, s.writer))
        registry.register(PolicyCollector(lambda: runtime.current, s.history))
    return RouterApp(app, proxy)
