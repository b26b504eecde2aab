"""The dashboard's endpoints: ``/ui`` (overview), ``/ui/tasks``, ``/ui/tasks/{id}``, ``/ui/latency``,
``/ui/policy``, and the login form.

Pages are rendered on the server (Jinja2, charts as inline SVG), so the dashboard needs no build
step, no JavaScript and nothing from the internet. With a master key set, every page needs a
session from the login form (see ``router.ui.session``); in open mode the pages are open like
the rest of the router; with virtual keys but no master key they stay locked, since no key a
client holds may read every task's spend.
"""

from __future__ import annotations

import asyncio
import functools
import html
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from router.digits import whole_number
from router.errors import ConfigError, PayloadTooLarge, PermissionDenied
from router.http.auth import Auth
from router.http.proxy import read_body
from router.policy.active import ActivePolicy, PolicyHistory
from router.rollout.preview import preview_posted
from router.store import OutcomeRecord, RequestRecord, Store
from router.store.window import latest_requests
from router.store.writer import LogWriter
from router.telemetry.ledger import said_by, tokens
from router.ui import charts, policyview, session, views

MAX_FORM_BYTES = 4096
MAX_POLICY_BYTES = 1024 * 1024
MAX_PAGE = 10**9
#: The policy page's default window (its arms' numbers and the preview): a revision's arms
#: gather tasks for days.
POLICY_WINDOW = "7d"

#: A page: a ``Dashboard`` method taking the request.
Page = Callable[["Dashboard", Request], Awaitable[Response]]


def environment() -> Environment:
    env = Environment(loader=PackageLoader("router.ui", "templates"), autoescape=select_autoescape(),
                      trim_blocks=True, lstrip_blocks=True)  # fmt: skip
    env.filters.update(usd=_usd, ms=_ms, pct=_pct, tokens=tokens, when=_when, when_utc=_when_utc,
                       verdict=views.verdict_text, said_by=said_by)  # fmt: skip
    env.globals.update(charts=charts, windows=list(views.WINDOWS), fmt_usd=_usd, fmt_pct=_pct)
    return env


def _usd(x: float | None) -> str:
    """Three significant digits, never in exponent form: agent calls often cost millionths of a dollar."""
    if x is None:
        return "—"
    if x == 0 or abs(x) >= 1:
        return f"${x:,.2f}"
    return f"${x:.{2 - math.floor(math.log10(abs(x)))}f}"


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x / 1000:.2f} s" if x >= 10_000 else f"{x:.1f} ms" if x < 100 else f"{x:.0f} ms"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def _when(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _when_utc(ts: float | None) -> str:
    """Local time with its zone, and UTC beside it where they differ (replicas and logs use UTC)."""
    if ts is None:
        return "—"
    local, utc = time.localtime(ts), time.gmtime(ts)
    shown = time.strftime("%Y-%m-%d %H:%M:%S %Z", local)
    if local.tm_gmtoff == 0:
        return shown if time.strftime("%Z", local) == "UTC" else f"{shown} (UTC)"
    return f"{shown} ({time.strftime('%Y-%m-%d %H:%M:%S', utc)} UTC)"


def gated(page: Page) -> Page:
    """The dashboard's one auth check: open in open mode, to this machine's pages (not another
    site's, nor one that rebinds its name here: ``router.http.browsers``); with a master key, a
    session from the login form (a browser without one is sent there); with virtual keys only, locked."""

    @functools.wraps(page)
    async def guarded(self: Dashboard, request: Request) -> Response:
        auth = self.auth
        if auth.open:
            try:
                auth.admit_browser(request.headers)
            except PermissionDenied as refused:
                return HTMLResponse(html.escape(refused.message), refused.status)
            return await page(self, request)
        secret = auth.session_secret()
        if secret is None:
            return self.render(request, "locked.html", 403)
        if self.sessions.valid(secret, request.cookies.get(session.COOKIE)):
            return await page(self, request)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/ui/login?next={quote(target)}", 303)

    return guarded


def same_origin(page: Page) -> Page:
    """A form POST from another site's page is refused (CSRF): the session cookie is
    ``SameSite=Strict`` already; this holds for browsers that do not honour it, and for the
    login form, which needs no cookie."""

    @functools.wraps(page)
    async def checked(self: Dashboard, request: Request) -> Response:
        if not session.same_origin(request.headers, request.url.scheme):
            return HTMLResponse("cross-site form posts are refused", 403)
        return await page(self, request)

    return checked


class Dashboard:
    """The dashboard's pages. ``runtime``: the policy in force; ``config``: the policy file in
    force, beside which a previewed edit is placed; ``max_requests``: the most requests of a
    window a page reads (the latest)."""

    def __init__(
        self, *, store: Store, writer: LogWriter, auth: Auth, runtime: Callable[[], ActivePolicy],
        history: PolicyHistory, config: Path, max_requests: int,
    ) -> None:  # fmt: skip
        self.store = store
        self.writer = writer
        self.auth = auth
        self.runtime = runtime
        self.history = history
        self.config = config
        self.max_requests = max_requests
        self.env = environment()
        self.sessions = session.Sessions()

    def register(self, app: FastAPI) -> None:
        for path, endpoint, methods in (
            ("/ui", self.overview, ["GET"]),
            ("/ui/tasks", self.tasks, ["GET"]),
            ("/ui/tasks/{task_id:path}", self.task, ["GET"]),
            ("/ui/latency", self.latency, ["GET"]),
            ("/ui/policy", self.policy, ["GET"]),
            ("/ui/policy/preview", self.policy_preview, ["POST"]),
            ("/ui/login", self.login_form, ["GET"]),
            ("/ui/login", self.login, ["POST"]),
            ("/ui/logout", self.logout, ["POST"]),
        ):
            app.add_api_route(
                path, endpoint, methods=methods, include_in_schema=False, response_class=HTMLResponse
            )

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        # The login form and the locked page are for someone not logged in: no "log out", and
        # nothing of the policy.
        shown = {"logged_in": self.auth.has_master, "policy_name": self.runtime().policy.name}
        if template in ("login.html", "locked.html"):
            shown = {"logged_in": False, "policy_name": None}
        html = self.env.get_template(template).render(path=request.url.path, **shown, **context)
        return HTMLResponse(html, status, headers={"cache-control": "no-store"})

    async def read(self, since: float, until: float) -> tuple[list[RequestRecord], list[OutcomeRecord], bool]:
        """The window's latest requests (at most ``max_requests``), its outcomes, and whether
        older requests of the window were left out."""
        requests, capped = await latest_requests(self.store, since, self.max_requests, views.UNREAD)
        requests = [r for r in requests if r.ts <= until]
        return requests, await self.store.outcomes_since(since), capped

    async def window(
        self, request: Request
    ) -> tuple[str, float, float, list[RequestRecord], list[OutcomeRecord], bool]:
        label, seconds = views.window_seconds(request.query_params.get("window"))
        until = time.time()
        since = until - seconds
        requests, outcomes, capped = await self.read(since, until)
        return label, since, until, requests, outcomes, capped

    def shown(self, capped: bool, requests: list[RequestRecord]) -> dict[str, Any]:
        """What the window template says of the rows read (the cap, and from when they start)."""
        return {
            "capped": self.max_requests if capped else None,
            "from_ts": requests[0].ts if requests else None,
        }

    @gated
    async def overview(self, request: Request) -> Response:
        label, since, until, requests, outcomes, capped = await self.window(request)
        # A page's numbers take up to seconds of Python: in a worker thread, so that the event
        # loop goes on serving the agents' requests meanwhile.
        names = {k.key_id: k.name for k in await self.store.list_keys()}
        data = await asyncio.to_thread(views.overview, requests, outcomes, since, until, names)
        return self.render(request, "overview.html", window=label, o=data, **self.shown(capped, requests))

    @gated
    async def tasks(self, request: Request) -> Response:
        label, _, _, requests, outcomes, capped = await self.window(request)
        q = request.query_params.get("q", "")
        page = request.query_params.get("page", "1")
        rows = await asyncio.to_thread(
            views.task_rows, requests, outcomes, q, whole_number(page, MAX_PAGE) or 1
        )
        return self.render(request, "tasks.html", window=label, q=q, t=rows, **self.shown(capped, requests))

    @gated
    async def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        most = self.max_requests
        # A task of many thousand requests is read as far as a window is, and laid out on a
        # worker thread: one look at it must not hold every client's replies (as /v1/tasks/{id}).
        # Opened straight after a reply, the page missed the request (the writer's batch).
        await self.writer.flush_for_reader()
        requests = await self.store.requests_for_task(task_id, most + 1)
        if not requests:
            return self.render(request, "missing.html", 404, task_id=task_id)
        capped, requests = len(requests) > most, requests[-most:]
        outcomes = await self.store.outcomes_for_task(task_id)
        d = await asyncio.to_thread(views.task_detail, task_id, requests, outcomes)
        return self.render(request, "task.html", d=d, **self.shown(capped, requests))

    @gated
    async def latency(self, request: Request) -> Response:
        label, _, _, requests, outcomes, capped = await self.window(request)
        lat = await asyncio.to_thread(views.latency, requests, outcomes)
        return self.render(request, "latency.html", window=label, lat=lat, **self.shown(capped, requests))

    def _diff(self, against: str, current: str) -> dict[str, Any] | None:
        archive = self.history.archive
        return policyview.diff(
            against, archive.archived(against), current, archive.archived(current),
            (archive.archived(against, "artifact"), archive.archived(current, "artifact")),
        )  # fmt: skip

    async def policy_page(self, request: Request, label: str, status: int = 200, **context: Any) -> Response:
        """``label``: the window of the arms' numbers and the preview's default."""
        rt, history = self.runtime(), self.history
        try:
            text = await asyncio.to_thread(Path(rt.policy.source).read_text)
        except OSError as exc:
            text = f"(cannot read {rt.policy.source}: {exc.strerror})"
        context.setdefault("edit", text)
        h = history.describe(rt)
        requests: list[RequestRecord] = []
        capped, arms = False, None
        if rt.control is not None:  # the arms are all the page reads the log for
            until = time.time()
            requests, outcomes, capped = await self.read(until - views.WINDOWS[label], until)
            arms = await asyncio.to_thread(policyview.arms, requests, outcomes, rt.revision)
        applied = await asyncio.to_thread(history.archive.since, rt.revision or "")
        against = request.query_params.get("diff") or next((m["revision"] for m in h["previous"]), None)
        diff = await asyncio.to_thread(self._diff, against, rt.revision) if against and rt.revision else None
        return self.render(
            request, "policy.html", status, rt=rt, yaml_text=text, h=h, window=label,
            control=policyview.control(rt), arms=arms,
            guard=policyview.guard(rt.policy.spec.guard, h["guard"], applied or rt.applied_at),
            scopes=policyview.scopes(rt.policy.spec), diff=diff, **self.shown(capped, requests), **context,
        )  # fmt: skip

    @gated
    async def policy(self, request: Request) -> Response:
        label, _ = views.window_seconds(request.query_params.get("window"), POLICY_WINDOW)
        return await self.policy_page(request, label)

    @same_origin
    @gated
    async def policy_preview(self, request: Request) -> Response:
        """The edit in the form, decided again over the logged traffic (``router preview``)."""
        try:
            form = parse_qs((await read_body(request, MAX_POLICY_BYTES)).decode("utf-8", "replace"))
        except PayloadTooLarge as exc:
            return await self.policy_page(request, POLICY_WINDOW, exc.status, preview_error=exc.message)
        edit = (form.get("yaml") or [""])[0]
        label, seconds = views.window_seconds((form.get("window") or [""])[0], POLICY_WINDOW)
        try:
            report = await preview_posted(self.store, edit.encode(), self.config, seconds, self.max_requests)
        except ConfigError as exc:
            return await self.policy_page(request, label, 400, edit=edit, preview_error=str(exc))
        return await self.policy_page(request, label, edit=edit, preview=report)

    async def login_form(self, request: Request) -> Response:
        if not self.auth.has_master:
            return RedirectResponse("/ui", 303)
        return self.render(request, "login.html", next=session.safe_next(request.query_params.get("next")))

    @same_origin
    async def login(self, request: Request) -> Response:
        secret = self.auth.session_secret()
        try:
            body = await read_body(request, MAX_FORM_BYTES)
        except PayloadTooLarge as exc:
            return Response(exc.message, exc.status)
        form = parse_qs(body.decode("utf-8", "replace"))
        target = session.safe_next((form.get("next") or [""])[0])
        # Stripped like the headers' keys: a key copied from a terminal brings its newline along.
        if secret is None or not self.auth.is_master((form.get("key") or [""])[0].strip()):
            return self.render(request, "login.html", 401, next=target, error="That is not the master key.")
        response = RedirectResponse(target, 303)
        response.set_cookie(session.COOKIE, self.sessions.issue(secret), max_age=session.TTL_S, path="/ui",
                            httponly=True, samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        return response

    @same_origin
    async def logout(self, request: Request) -> Response:
        if (secret := self.auth.session_secret()) is not None:
            self.sessions.revoke(secret, request.cookies.get(session.COOKIE))
        response = RedirectResponse("/ui/login", 303)
        response.delete_cookie(session.COOKIE, path="/ui", httponly=True, samesite="strict")
        return response
