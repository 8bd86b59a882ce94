"""The dashboard's bulk changes (issue 32): from a search, run again every FAILED or CANCELLED
match, or resolve every UNCERTAIN one not done or by a read-back, as `outbox retry` and `outbox
resolve` do with a filter. Two steps, each a POST with the process's form key and a reason:
the preview is the dry run of the ids that the filter chooses now (among the states the change
acts on, at most :data:`BULK_MAX`); its confirmation posts exactly those ids, and the change is
made on them, all or none (an action that changed meanwhile is a refusal, and nothing is
written). Audited with surface ``dashboard``, as every operator's change."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from ..errors import InvalidFilter, InvalidRequest
from ..operator_changes import ACTS_ON, Plan, Resolution, among_acted_on, change_many
from ..outbox import Outbox
from ..search import amatching_ids, filter_from_text
from .operator_routes import authorized_form, first_line

# The most actions one bulk change may name (as `outbox retry --max`'s default).
BULK_MAX = 1000

# The bulk changes a search offers: the form's value, the change, and its label.
BULK_OPERATIONS: dict[str, tuple[Resolution, str]] = {
    "retry": (Resolution.RETRY, "run again"),
    "resolve-absent": (Resolution.ABSENT, "resolve not done"),
    "resolve-retry": (Resolution.READ_BACK, "read back again"),
}


def bulk_route(
    outbox: Outbox,
    conninfo: str,
    form_key: str,
    actor: str,
    authorized: Callable[[Request], bool],
    refused: Callable[[], Response],
    templates: Jinja2Templates,
    fields: dict[str, str],
) -> Callable[[Request], Awaitable[Response]]:
    """The POST handler of ``/search/bulk``; ``fields`` are the search form's fields."""

    async def bulk(request: Request) -> Response:
        form = await authorized_form(request, form_key, authorized, refused)
        if isinstance(form, Response):
            return form
        query = {name: form[name].strip() for name in fields if form.get(name, "").strip()}
        context: dict[str, Any] = {
            "q": query,
            "fields": fields,
            "form_key": form_key,
            "operation": form.get("operation", ""),
            "reason": form.get("reason", "").strip(),
            "plan": None,
            "ids": "",
            "notice": None,
            "ok": True,
        }
        notice, status = await _step(outbox, conninfo, actor, form, query, context)
        context["notice"], context["ok"] = notice, status < 400 and context["ok"]
        return templates.TemplateResponse(request, "bulk.html", context, status_code=status)

    return bulk


async def _step(
    outbox: Outbox,
    conninfo: str,
    actor: str,
    form: dict[str, str],
    query: dict[str, str],
    context: dict[str, Any],
) -> tuple[str | None, int]:
    """The preview, or with ``ids`` in the form its confirmation: the page's notice and status
    (``context`` gains the plan and the ids to confirm)."""
    chosen = BULK_OPERATIONS.get(context["operation"])
    if chosen is None:
        return f"no bulk change {context['operation']!r}", 400
    how, label = chosen
    context["label"] = label
    reason = context["reason"]
    if not reason:
        return "a reason is required (it is kept in each action's audit)", 400
    if not query:
        return "give the search a filter first: a bulk change acts on what it finds", 400
    try:
        async with await psycopg.AsyncConnection.connect(conninfo, connect_timeout=10) as conn:
            if "ids" in form:
                ids = _ids(form["ids"])
                plan = await change_many(conn, outbox, ids, how, reason, actor, surface="dashboard")
                return _written(plan, label, context)
            action_filter = among_acted_on(filter_from_text(query), how)
            ids = await amatching_ids(conn, outbox, action_filter, BULK_MAX)
            if not ids:
                states = " or ".join(ACTS_ON[how])
                return f"no {states} action matches this search: nothing to change", 200
            if len(ids) > BULK_MAX:
                return (
                    f"more than {BULK_MAX} actions match: narrow the search (nothing was changed)",
                    409,
                )
            plan = await change_many(
                conn, outbox, ids, how, reason, actor, surface="dashboard", dry_run=True
            )
    except (InvalidFilter, InvalidRequest) as exc:
        return str(exc), 400
    except psycopg.OperationalError as exc:
        return f"the bulk change did not run: {first_line(exc, conninfo)}", 503
    context["plan"] = plan
    if plan.refusals:
        context["ok"] = False
        return f"{len(plan.refusals)} of {len(ids)} actions refused: nothing can be changed", 200
    context["ids"] = ",".join(str(one) for one in ids)
    return f"{label}: {len(ids)} actions would change; confirm below", 200


def _ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise InvalidRequest("ids", f"not a list of action ids: {text[:80]!r}")
    if len(parts) > BULK_MAX:
        raise InvalidRequest("ids", f"at most {BULK_MAX} actions at once")
    return [int(part) for part in parts]


def _written(plan: Plan, label: str, context: dict[str, Any]) -> tuple[str, int]:
    context["plan"] = plan
    if plan.refusals:
        context["ok"] = False
        return (
            f"{len(plan.refusals)} actions refused (one changed meanwhile?): nothing was changed",
            409,
        )
    return f"{label}: {len(plan.changes)} actions changed", 200
