"""The dashboard's routes: the page, its panels (for live refreshes), the events stream, the
two operator actions, the search of actions and one action's page. See
:mod:`outbox_core.dashboard`."""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import InvalidFilter
from ..migrations import MISSING_OBJECT
from ..operator import OperatorRefused, cancel_unstarted, run_now
from ..outbox import Outbox
from ..search import DEFAULT_LIMIT, filter_from_text, find_actions, parse_limit
from .bulk_routes import bulk_route
from .operator_routes import authorized_form, first_line, operator_route
from .panels import read_panels

TOKEN_COOKIE = "outbox_dashboard_token"
# A live page refreshes on each notification of the outbox's channel, at most this often, and
# at least this often without one (endings notify nobody).
REFRESH_AT_MOST_SECONDS = 1.0
REFRESH_AT_LEAST_SECONDS = 5.0

_HERE = resources.files(__package__)

# The search form's fields: ActionFilter's, by their names (a form field per name).
SEARCH_FIELDS = {
    "kind": "kind",
    "states": "states (FAILED,UNCERTAIN)",
    "stop_reason": "stop reason",
    "lane_key": "lane",
    "key": "key",
    "key_prefix": "key prefix",
    "subject": "subject",
    "workspace": "workspace",
    "created_since": "made since",
    "created_until": "made until",
    "ended_since": "ended since",
    "ended_until": "ended until",
}


def create_app(
    outbox: Outbox, conninfo: str, *, token: str | None = None, user: str | None = None
) -> Starlette:
    """The dashboard of ``outbox``'s database at ``conninfo``. With ``token``, every request
    must carry it (``?token=`` once, which sets a cookie; or ``Authorization: Bearer``).
    ``user`` is the actor of the operator's changes in their audit rows (else "dashboard")."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    # Every form carries this process's key: a page of another site cannot post to the
    # dashboard on the operator's behalf (the browser sends it no cookie either: SameSite).
    form_key = secrets.token_urlsafe(24)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        offered = (
            request.query_params.get("token")
            or request.cookies.get(TOKEN_COOKIE)
            or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        )
        return bool(offered) and hmac.compare_digest(offered.encode(), token.encode())

    def refused() -> Response:
        return PlainTextResponse(
            "this dashboard needs its token: open it with ?token=... (OUTBOX_DASHBOARD_TOKEN)",
            status_code=401,
        )

    def read() -> Any:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            return read_panels(conn, outbox)

    async def render(
        request: Request,
        name: str,
        *,
        notice: str | None = None,
        status: int = 200,
        ok: bool = True,
    ) -> Response:
        panels, down = None, None
        try:
            panels = await run_in_threadpool(read)
        except psycopg.Error as exc:
            # The page says so in a banner and tries again: no bare 500, no traceback.
            down, status = database_down(exc, conninfo), 503
        response = templates.TemplateResponse(
            request,
            name,
            {"p": panels, "down": down, "form_key": form_key, "notice": notice, "ok": ok},
            status_code=status,
        )
        if token is not None and request.query_params.get("token"):
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response

    async def page(request: Request) -> Response:
        if not authorized(request):
            return refused()
        return await render(request, "dashboard.html")

    async def panels(request: Request) -> Response:
        if not authorized(request):
            return refused()
        return await render(request, "panels.html")

    async def operate(request: Request) -> Response:
        form = await authorized_form(request, form_key, authorized, refused)
        if isinstance(form, Response):
            return form
        raw = form.get("action_id", "").strip()
        if not raw.isdigit() or int(raw) < 1:
            return await render(
                request, "dashboard.html", notice=f"not an action id: {raw!r}", status=400, ok=False
            )
        action_id = int(raw)
        operation = request.path_params["operation"]
        reason = form.get("reason", "").strip() or None
        audit: dict[str, Any] = {
            "reason": reason,
            "by": user or "dashboard",
            "surface": "dashboard",
        }
        try:
            if operation == "cancel":
                async with await psycopg.AsyncConnection.connect(conninfo) as conn:
                    action = await cancel_unstarted(conn, outbox, action_id, **audit)
                notice = f"cancelled action {action.id} ({action.kind} in lane {action.lane_key})"
            else:
                action = await run_now(outbox, conninfo, action_id, **audit)
                notice = f"ran action {action.id} ({action.kind}): now {action.state}"
        except OperatorRefused as exc:
            return await render(request, "dashboard.html", notice=str(exc), status=409, ok=False)
        except psycopg.OperationalError as exc:
            notice = f"{operation} of action {action_id} did not run: " + database_down(
                exc, conninfo
            )
            return await render(request, "dashboard.html", notice=notice, status=503, ok=False)
        return await render(request, "dashboard.html", notice=notice)

    def search_page(query: dict[str, str]) -> dict[str, Any]:
        # A form sends its empty fields as empty texts: those leave the field out.
        given = {name: value.strip() for name, value in query.items() if value.strip()}
        context: dict[str, Any] = {"q": given, "page": None, "problem": None}
        try:
            action_filter = filter_from_text(
                {name: given.get(name) for name in SEARCH_FIELDS if name in given}
            )
            limit = parse_limit(given.get("limit", str(DEFAULT_LIMIT)))
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                context["page"] = find_actions(
                    conn, outbox, action_filter, limit, given.get("cursor")
                )
        except InvalidFilter as exc:
            context["problem"] = str(exc)
        return context

    async def search(request: Request) -> Response:
        if not authorized(request):
            return refused()
        try:
            context = await run_in_threadpool(search_page, dict(request.query_params))
        except psycopg.Error as exc:
            context, status = {"q": {}, "page": None, "problem": database_down(exc, conninfo)}, 503
        else:
            status = 400 if context["problem"] else 200
        context["fields"], context["form_key"] = SEARCH_FIELDS, form_key
        return templates.TemplateResponse(request, "search.html", context, status_code=status)

    def read_action(action_id: int) -> Any:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            return outbox.get(conn, action_id)

    async def action_page(
        request: Request, *, notice: str | None = None, status: int = 200, ok: bool = True
    ) -> Response:
        if not authorized(request):
            return refused()
        action_id = request.path_params["action_id"]
        try:
            action = await run_in_threadpool(read_action, action_id)
        except psycopg.Error as exc:
            return PlainTextResponse(database_down(exc, conninfo), status_code=503)
        if action is None:
            return PlainTextResponse(f"no action {action_id}", status_code=404)
        context = {
            "action": action.as_dict(),
            "id": action_id,
            "form_key": form_key,
            "notice": notice,
            "ok": ok,
        }
        return templates.TemplateResponse(request, "action.html", context, status_code=status)

    async def events(request: Request) -> Response:
        if not authorized(request):
            return refused()
        return StreamingResponse(
            _refreshes(conninfo, outbox.channel),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    routes = [
        Route("/", page, name="page"),
        Route("/panels", panels, name="panels"),
        Route("/events", events, name="events"),
        Route("/search", search, name="search"),
        Route(
            "/search/bulk",
            bulk_route(
                outbox,
                conninfo,
                form_key,
                user or "dashboard",
                authorized,
                refused,
                templates,
                SEARCH_FIELDS,
            ),
            methods=["POST"],
            name="bulk",
        ),
        Route("/action/{action_id:int}", action_page, name="action"),
        Route("/actions/{operation:str}", operate, methods=["POST"], name="operate"),
        Route(
            "/action/{action_id:int}/{operation:str}",
            operator_route(
                outbox, conninfo, form_key, user or "dashboard", authorized, refused, action_page
            ),
            methods=["POST"],
            name="operator",
        ),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    return app


def database_down(exc: psycopg.Error, conninfo: str) -> str:
    """What the banner says when the panels cannot be read: the database's own first line (its
    password hidden), and what the page does about it."""
    first = first_line(exc, conninfo)
    if isinstance(exc, MISSING_OBJECT):
        return (
            f"outbox's schema, or a part of it that this build needs, is missing ({first}): "
            "run `outbox migrate`; this page tries again every few seconds"
        )
    return f"cannot reach the database ({first}); this page tries again every few seconds"


async def _refreshes(conninfo: str, channel: str) -> AsyncIterator[str]:
    """``refresh`` events: on each notification of the outbox's channel (an admitted action
    was enqueued), at most once a second, and every few seconds without one. While the
    database cannot be reached, one every few seconds too (the page then shows its banner),
    until it answers again."""
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=10
            ) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                yield "event: refresh\ndata: connected\n\n"
                while True:
                    notified = False
                    async for _ in conn.notifies(timeout=REFRESH_AT_LEAST_SECONDS, stop_after=1):
                        notified = True
                    if notified:  # notifications that arrive together make one refresh
                        await asyncio.sleep(REFRESH_AT_MOST_SECONDS)
                    yield "event: refresh\ndata: tick\n\n"
        except psycopg.OperationalError:
            yield "event: refresh\ndata: database-down\n\n"
            await asyncio.sleep(REFRESH_AT_LEAST_SECONDS)
