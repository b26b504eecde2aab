"""Operations endpoints: ``/healthz``, ``/readyz``, ``GET /metrics`` (Prometheus), ``GET /v1/tasks/{task_id}``
(the task ledger), ``GET /v1/policy`` (the policy's revisions) and ``POST /v1/policy/preview`` (a
policy edit tried on the logged traffic, ``router.rollout.preview``).

``/metrics`` is open, like the health endpoints: it holds counts, timings and dollars per backend,
never prompts or keys, and scrapers rarely carry credentials. The ledger names tasks and their
spend, and the policy names files and models, so they take the master key when one is set.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.errors import BadRequest, ConfigError, TaskNotFound
from router.features.task.context import TaskContext
from router.features.task.identity import scoped
from router.forward.upstream import Upstream
from router.http.auth import Auth, Principal
from router.http.endpoints import keyed
from router.http.proxy import read_body
from router.http.replies import json_reply
from router.policy.active import ActivePolicyHolder, PolicyHistory
from router.rollout.preview import preview_posted
from router.shared import SharedState
from router.store import Store
from router.store.window import parse_duration
from router.store.writer import LogWriter
from router.telemetry import Telemetry
from router.telemetry.ledger import load_task
from router.telemetry.metrics import CONTENT_TYPE_LATEST


class Probes:
    """``/healthz`` and ``/readyz``: open, for load balancers."""

    def __init__(
        self, *, writer: LogWriter, state: SharedState, upstream: Upstream, runtime: ActivePolicyHolder,
        history: PolicyHistory, draining: Callable[[], bool],
    ) -> None:  # fmt: skip
        self.writer = writer
        self.state = state
        self.upstream = upstream
        self.runtime = runtime
        self.history = history
        self.draining = draining

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/healthz", self.healthz, methods=["GET"], tags=["health"])
        app.add_api_route("/readyz", self.readyz, methods=["GET"], tags=["health"])

    async def healthz(self) -> Response:
        return json_reply({"status": "ok"})

    async def readyz(self) -> Response:
        if self.draining():
            return json_reply({"status": "draining"}, 503)
        # A degraded replica still serves: the log buffers while its store is down, and pins and
        # rate limits fall back to local state while Redis is (budgets refuse with 503 meanwhile).
        store_ok = await self.writer.store_answers(within=1.0)  # a hung store must not hang the check
        state_ok = await self.state.ping()
        rt = self.runtime.current
        rejected = self.history.last_rejected
        log_trouble = self.writer.trouble
        # Every request to such a backend fails over (or is a 500 where none is left), while the
        # router looked ready: the policy's key variables unset, a new user's first hour.
        unkeyed = rt.catalog.missing_credentials()
        healthy = store_ok and state_ok and rejected is None and log_trouble is None and not unkeyed
        body = {
            "status": "ok" if healthy else "degraded",
            "store": store_ok,
            "shared_state": state_ok,
            "log_buffered": self.writer.buffered,
            # Cross-protocol calls wait for litellm until it has loaded (seconds after a start).
            "translation_loaded": self.upstream.translation_ready,
            # Answered requests not yet in the log: a failing store (a full disk) or a backlog.
            "log_error": log_trouble,
            "state_fail_open": dict(self.state.fail_open_counts),
            "state_error": None if state_ok else self.state.last_error,
            "policy": rt.policy.name,
            "scorer": rt.decider.scorer.name,
            "policy_revision": rt.revision,
            # The file on disk was refused: the router serves the previous revision meanwhile.
            "policy_rejected": rejected.as_dict() if rejected else None,
            "missing_credentials": unkeyed,
        }
        return json_reply(body)


class Metrics:
    """``GET /metrics``: open, for scrapers (Prometheus' text format)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/metrics", self.metrics, methods=["GET"], tags=["ops"])

    async def metrics(self) -> Response:
        body = self.telemetry.exposition()
        if body is None:
            return Response(b"metrics are not enabled\n", 404, media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE_LATEST)


class Ops:
    """The task ledger and the policy's revisions and preview, for callers with a key."""

    def __init__(
        self, *, auth: Auth, store: Store, writer: LogWriter, tasks: TaskContext, runtime: ActivePolicyHolder,
        history: PolicyHistory, max_body_bytes: int, max_window_requests: int,
    ) -> None:  # fmt: skip
        self.auth = auth
        self.store = store
        self.writer = writer
        self.tasks = tasks
        self.runtime = runtime
        self.history = history
        self.max_body_bytes = max_body_bytes
        self.max_window_requests = max_window_requests

    def register(self, app: FastAPI) -> None:
        # Without this, FastAPI redirected to /v1/tasks/, which answered "no request of task ''".
        app.add_api_route("/v1/tasks", self.no_task, methods=["GET"], tags=["ops"], include_in_schema=False)
        app.add_api_route("/v1/tasks/{task_id:path}", self.task, methods=["GET"], tags=["ops"])
        app.add_api_route("/v1/policy", self.policy, methods=["GET"], tags=["ops"])
        app.add_api_route("/v1/policy/preview", self.policy_preview, methods=["POST"], tags=["ops"])

    @keyed()
    async def no_task(self, request: Request, principal: Principal) -> Response:
        return await self.ledger(principal, "")

    @keyed()
    async def task(self, request: Request, principal: Principal, task_id: str) -> Response:
        return await self.ledger(principal, task_id)

    async def ledger(self, principal: Principal, task_id: str) -> Response:
        # A virtual key reads its own tasks' ledgers (ids scoped to it); the master key any.
        if not task_id:
            raise BadRequest(
                "GET /v1/tasks/{task_id} reads one task's ledger: name the task (there is no list "
                "of tasks here; `router tasks --recent` lists the recent ones)",
                code="task_id_required", param="task_id",
            )  # fmt: skip
        scoped_id = scoped(principal.key_id, task_id)
        # Read straight after a reply (a harness checking what its task cost), the task was a 404 or
        # lacked its latest request.
        await self.writer.flush_for_reader()
        ledger = await load_task(self.store, scoped_id, self.max_window_requests)
        if ledger is None:
            raise TaskNotFound(task_id)
        ledger["stopped"] = await self.tasks.stopped(scoped_id)
        return json_reply(ledger)

    @keyed(master_only=True)
    async def policy(self, request: Request, principal: Principal) -> Response:
        """The revision in force, the ones before it, and the last refused reload."""
        return json_reply(self.history.describe(self.runtime.current))

    @keyed(master_only=True)
    async def policy_preview(self, request: Request, principal: Principal) -> Response:
        """``router preview`` for a policy YAML posted as the body (``?since=7d``)."""
        text = await read_body(request, self.max_body_bytes)
        try:
            seconds = parse_duration(request.query_params.get("since", "7d"))
            report = await preview_posted(
                self.store, text, self.history.archive.policy_path, seconds, self.max_window_requests
            )
        except ConfigError as exc:
            raise BadRequest(str(exc), code="invalid_policy") from None
        return json_reply(report)
