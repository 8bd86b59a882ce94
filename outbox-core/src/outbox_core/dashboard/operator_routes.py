"""The operator's forms on an action's page (issue 32): resolve an UNCERTAIN action done, not
done or by a read-back, and run a FAILED or CANCELLED one again. Each is a POST with the
process's form key and a reason, audited with surface ``dashboard``; a refusal is the page's
notice (409), never a 500."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import psycopg
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..errors import InvalidRequest
from ..operator import OperatorRefused, resolve_absent, resolve_done, resolve_retry, retry
from ..outbox import Outbox
from ..settings_section import hide_url

# The operations a form may name.
OPERATIONS = ("resolve-done", "resolve-absent", "resolve-retry", "retry")


def first_line(exc: psycopg.Error, conninfo: str) -> str:
    """The database's own first line of an error, its password hidden: what every notice and
    banner of the dashboard quotes."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return hide_url(first, conninfo)


def STALE_FORM() -> Response:  # noqa: N802 (a fixed answer)
    return PlainTextResponse("stale or foreign form: reload the dashboard", 403)


async def posted_form(request: Request, form_key: str) -> dict[str, str] | None:
    """The small fields of an urlencoded form (python-multipart is not needed for them), or
    None when it does not carry this process's ``form_key``."""
    form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
    if not hmac.compare_digest(form.get("form_key", "").encode(), form_key.encode()):
        return None
    return form


async def authorized_form(
    request: Request,
    form_key: str,
    authorized: Callable[[Request], bool],
    refused: Callable[[], Response],
) -> dict[str, str] | Response:
    """The posted form of an allowed request, or the answer that refuses it (no token, a
    stale or foreign form): every POST of the dashboard starts here."""
    if not authorized(request):
        return refused()
    form = await posted_form(request, form_key)
    return STALE_FORM() if form is None else form


ActionPage = Callable[..., Awaitable[Response]]


def operator_route(
    outbox: Outbox,
    conninfo: str,
    form_key: str,
    actor: str,
    authorized: Callable[[Request], bool],
    refused: Callable[[], Response],
    action_page: ActionPage,
) -> Callable[[Request], Awaitable[Response]]:
    """The POST handler of ``/action/{id}/{operation}``; ``action_page`` renders the page
    again with a notice."""

    async def operate(request: Request) -> Response:
        form = await authorized_form(request, form_key, authorized, refused)
        if isinstance(form, Response):
            return form
        action_id: int = request.path_params["action_id"]
        operation: str = request.path_params["operation"]
        if operation not in OPERATIONS:
            return PlainTextResponse(f"no operation {operation!r}", 404)
        reason = form.get("reason", "").strip()
        if not reason:
            return await action_page(request, notice="a reason is required", status=400, ok=False)
        try:
            notice = await _run(outbox, conninfo, operation, action_id, form, reason, actor)
        except InvalidRequest as exc:
            return await action_page(request, notice=str(exc), status=400, ok=False)
        except OperatorRefused as exc:
            return await action_page(request, notice=str(exc), status=409, ok=False)
        except psycopg.OperationalError as exc:
            notice = f"{operation} of action {action_id} did not run: {first_line(exc, conninfo)}"
            return await action_page(request, notice=notice, status=503, ok=False)
        return await action_page(request, notice=notice)

    return operate


async def _run(
    outbox: Outbox,
    conninfo: str,
    operation: str,
    action_id: int,
    form: dict[str, str],
    reason: str,
    actor: str,
) -> str:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        common: dict[str, Any] = {"by": actor, "surface": "dashboard"}
        if operation == "resolve-done":
            ref = form.get("ref", "").strip()
            action = await resolve_done(conn, outbox, action_id, ref, reason, **common)
            return f"resolved action {action.id} done ({ref}): now {action.state}"
        if operation == "resolve-absent":
            action = await resolve_absent(conn, outbox, action_id, reason, **common)
            return f"resolved action {action.id} not done: now {action.state}"
        if operation == "resolve-retry":
            action = await resolve_retry(conn, outbox, action_id, reason, **common)
            return f"action {action.id} will be read back: now {action.state}"
        new = await retry(conn, outbox, action_id, reason, **common)
        return f"retried action {action_id} as action {new.id} (key {new.idempotency_key})"
