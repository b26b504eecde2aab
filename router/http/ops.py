"""Operations endpoints: ``/healthz``, ``/readyz``, ``GET /metrics`` (Prometheus), ``GET /v1/tasks/{task_id}``
(the task ledger), ``GET /v1/policy`` (the policy's revisions) and ``POST /v1/policy/preview`` (a
policy edit tried on the logged traffic, ``router.rollout.preview``).

``/metrics`` is open, like the health endpoints: it holds counts, timings and dollars per backend,
never prompts or keys, and scrapers rarely carry credentials. The ledger names tasks and their
spend, and the policy names files and models, so they take the master key when one is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.errors import BadRequest, ConfigError, RouterError, TaskNotFound
from router.features.task.identity import scoped
from router.forward.upstream import Upstream
from router.http.auth import Auth
from router.http.proxy import read_body
from router.http.replies import error_reply, json_reply
from router.policy.runtime import PolicyHistory, RuntimeHolder
from router.rollout.preview import preview_posted
from router.state import SharedState
from router.store import Store
from router.store.window import parse_duration
from router.store.writer import LogWriter
from router.telemetry import Telemetry
from router.telemetry.ledger import load_task
from router.telemetry.metrics import CONTENT_TYPE_LATEST


def register_ops(
    app: FastAPI, *, auth: Auth, store: Store, state: SharedState, writer: LogWriter, telemetry: Telemetry,
    runtime: RuntimeHolder, history: PolicyHistory, upstream: Upstream, draining: Callable[[], bool],
    max_body_bytes: int, max_window_requests: int,
) -> None:  # fmt: skip
    @app.get("/healthz", tags=["health"])
    async def healthz() -> Response:
        return json_reply({"status": "ok"})

    @app.get("/readyz", tags=["health"])
    async def readyz() -> Response:
        if draining():
            return json_reply({"status": "draining"}, 503)
        # A degraded replica still serves: the log buffers while its store is down, and pins and
        # rate limits fall back to local state while Redis is (budgets refuse with 503 meanwhile).
        try:
            async with asyncio.timeout(1.0):  # a hung store must not hang the health check
                store_ok = await store.ping()
        except TimeoutError:
            store_ok = False
        state_ok = await state.ping()
        rt = runtime.current
        rejected = history.last_rejected
        log_trouble = writer.trouble
        healthy = store_ok and state_ok and rejected is None and log_trouble is None
        body = {
            "status": "ok" if healthy else "degraded",
            "store": store_ok,
            "shared_state": state_ok,
            "log_buffered": writer.buffered,
            # Cross-protocol calls wait for litellm until it has loaded (seconds after a start).
            "translation_loaded": upstream.translation_ready,
            # Answered requests not yet in the log: a failing store (a full disk) or a backlog.
            "log_error": log_trouble,
            "state_fail_open": dict(state.fail_open_counts),
            "state_error": None if state_ok else state.last_error,
            "policy": rt.policy.name,
            "scorer": rt.decider.scorer.name,
            "policy_revision": rt.revision,
            # The file on disk was refused: the router serves the previous revision meanwhile.
            "policy_rejected": rejected.as_dict() if rejected else None,
        }
        return json_reply(body)

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        body = telemetry.exposition()
        if body is None:
            return Response(b"metrics are not enabled\n", 404, media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/tasks", tags=["ops"], include_in_schema=False)
    async def no_task(request: Request) -> Response:
        # Without this, FastAPI redirected to /v1/tasks/, which answered "no request of task ''".
        return await task("", request)

    @app.get("/v1/tasks/{task_id:path}", tags=["ops"])
    async def task(task_id: str, request: Request) -> Response:
        try:
            # A virtual key reads its own tasks' ledgers (ids scoped to it); the master key any.
            principal = await auth.check(request)
            if not task_id:
                raise BadRequest(
                    "GET /v1/tasks/{task_id} reads one task's ledger: name the task (there is no list "
                    "of tasks here; `router tasks --recent` lists the recent ones)",
                    code="task_id_required", param="task_id",
                )  # fmt: skip
            ledger = await load_task(store, scoped(principal.key_id, task_id), max_window_requests)
            if ledger is None:
                raise TaskNotFound(task_id)
        except RouterError as err:
            return error_reply(err)
        return json_reply(ledger)

    @app.get("/v1/policy", tags=["ops"])
    async def policy(request: Request) -> Response:
        """The revision in force, the ones before it, and the last refused reload."""
        try:
            await auth.check(request, master_only=True)
        except RouterError as err:
            return error_reply(err)
        return json_reply(history.describe(runtime.current))

    @app.post("/v1/policy/preview", tags=["ops"])
    async def policy_preview(request: Request) -> Response:
        """``router preview`` for a policy YAML posted as the body (``?since=7d``)."""
        try:
            await auth.check(request, master_only=True)
            text = await read_body(request, max_body_bytes)
            try:
                seconds = parse_duration(request.query_params.get("since", "7d"))
                report = await preview_posted(
                    store, text, history.archive.policy_path, seconds, max_window_requests
                )
            except ConfigError as exc:
                raise BadRequest(str(exc), code="invalid_policy") from None
        except RouterError as err:
            return error_reply(err)
        return json_reply(report)
