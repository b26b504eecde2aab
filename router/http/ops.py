"""Operations endpoints: ``GET /metrics`` (Prometheus), ``GET /v1/tasks/{task_id}`` (the task ledger)
``GET /v1/policy`` (the policy's revisions) and ``POST /v1/policy/preview`` (a policy edit tried on
the logged traffic, ``router.learning.preview``).

``/metrics`` is open, like the health endpoints: it holds counts, timings and dollars per backend,
never prompts or keys, and scrapers rarely carry credentials. The ledger names tasks and their
spend, and the policy names files and models, so they take the master key when one is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from router.errors import BadRequest, ConfigError, RouterError
from router.features.task.identity import scoped
from router.http.proxy import read_body
from router.learning.preview import preview_posted
from router.store.window import parse_duration
from router.telemetry.health import HealthCollector
from router.telemetry.ledger import load_task
from router.telemetry.metrics import CONTENT_TYPE_LATEST
from router.telemetry.policy import PolicyCollector

if TYPE_CHECKING:
    from router.app.factory import Services


class TaskNotFound(BadRequest):
    status = 404

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"no request of task {task_id!r} is in the log", code="task_not_found", param="task_id"
        )


def register_ops(app: FastAPI, s: Services) -> None:
    # Routes are labelled by the policy in force, which a reload may replace.
    s.telemetry.use_policy(lambda: s.policy)
    registry = getattr(getattr(s.telemetry, "metrics", None), "registry", None)
    if registry is not None:
        registry.register(HealthCollector(s))
        registry.register(PolicyCollector(lambda: s.runtime, s.history))

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        body = s.telemetry.exposition()
        if body is None:
            return Response(b"metrics are not enabled\n", 404, media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/tasks/{task_id:path}", tags=["ops"])
    async def task(task_id: str, request: Request) -> Response:
        try:
            # A virtual key reads its own tasks' ledgers (ids scoped to it); the master key any.
            principal = await s.auth.check(request)
            ledger = await load_task(s.store, scoped(principal.key_id, task_id))
            if ledger is None:
                raise TaskNotFound(task_id)
        except RouterError as err:
            return Response(orjson.dumps(err.openai_body()), err.status, media_type="application/json")
        return Response(orjson.dumps(ledger), media_type="application/json")

    @app.get("/v1/policy", tags=["ops"])
    async def policy(request: Request) -> Response:
        """The revision in force, the ones before it, and the last refused reload."""
        try:
            await s.auth.check(request, master_only=True)
        except RouterError as err:
            return Response(orjson.dumps(err.openai_body()), err.status, media_type="application/json")
        return Response(orjson.dumps(s.history.describe(s.runtime)), media_type="application/json")

    @app.post("/v1/policy/preview", tags=["ops"])
    async def policy_preview(request: Request) -> Response:
        """``router preview`` for a policy YAML posted as the body (``?since=7d``)."""
        try:
            await s.auth.check(request, master_only=True)
            text = await read_body(request, s.settings.max_body_bytes)
            try:
                seconds = parse_duration(request.query_params.get("since", "7d"))
                report = await preview_posted(s.store, text, s.settings.config, seconds)
            except ConfigError as exc:
                raise BadRequest(str(exc), code="invalid_policy") from None
        except RouterError as err:
            return Response(orjson.dumps(err.openai_body()), err.status, media_type="application/json")
        return Response(orjson.dumps(report), media_type="application/json")
