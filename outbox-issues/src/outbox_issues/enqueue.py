"""The application's entry points: store a report and carry it to the tracker, publish it, make
it private, in the caller's transaction, sync and async, one shape.

Every action of a report runs in the report's lane, ``file_issue:<report>``, in id order, and
every function here enqueues under the filing's row lock, so the order in the lane is the order
the application asked for. Payloads hold identifiers only (report, generation); the adapters
read the rest. What cannot run is refused here, with a clear error, before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import ActionRequest, Enqueued, InvalidRequest, Outbox, default_outbox

from .adapter import CONTENT_REFUSED, FILE_ISSUE, PUBLISH_REPORT, TRANSFER_ISSUE, TrackerAdapter
from .content import check_fits
from .domain import (
    Check,
    Enqueue,
    FilingState,
    Sql,
    Step,
    file_key,
    lane,
    publish_key,
    run_async,
    run_sync,
    transfer_key,
)
from .errors import NotConfigured, NotFiled, ReportErased, UnknownReport
from .hookspecs import DraftContext, NoDraft
from .settings import IssuesSettings

REPORT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True, slots=True)
class Submitted:
    """What a call enqueued: the report's generation and the actions (None: not enqueued).
    ``created`` is False when the report was already submitted (nothing changed then)."""

    report_id: str
    generation: int
    created: bool
    file_action_id: int | None = None
    publish_action_id: int | None = None
    draft_action_id: int | None = None
    transfer_action_id: int | None = None
    draft_skipped: str | None = None
    """Why no draft was enqueued although a draft plugin is installed (no model configured):
    the issue uses the report's own text. None otherwise."""


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(field, "must be a non-empty string")
    return value


def _report_id(value: object) -> str:
    if not isinstance(value, str) or not REPORT_ID.match(value):
        raise InvalidRequest(
            "report_id", "use 1-100 letters, digits, '.', '_' or '-' (it names lanes and keys)"
        )
    return value


def _draft_request(outbox: Outbox, context: DraftContext) -> ActionRequest | NoDraft | None:
    """The draft action an installed plugin (outbox-draft) asks for, checked; or why it makes
    none (:class:`NoDraft`)."""
    hook = getattr(outbox.host.hook, "outbox_issues_draft_request", None)
    if hook is None:
        return None
    request = hook(draft=context, outbox=outbox)
    if request is None or isinstance(request, NoDraft):
        return request
    if not isinstance(request, ActionRequest):
        raise InvalidRequest("draft", f"the draft hook returned {request!r}, not an ActionRequest")
    if request.lane_key != context.lane_key or request.idempotency_key != context.idempotency_key:
        raise InvalidRequest(
            "draft",
            f"the draft must run in lane {context.lane_key!r} with key "
            f"{context.idempotency_key!r} (got {request.lane_key!r}, {request.idempotency_key!r})",
        )
    return request


def _draft_context(report_id: str, generation: int, workspace_id: str, text: str) -> DraftContext:
    return DraftContext(
        report_id=report_id,
        generation=generation,
        workspace_id=workspace_id,
        lane_key=lane(report_id),
        idempotency_key=f"draft:{report_id}:{generation}",
        text=text,
    )


def _locked(row: tuple[Any, ...] | None, report_id: str) -> tuple[FilingState, int, str, bool]:
    if row is None:
        raise UnknownReport("report_id", f"no report {report_id!r} was submitted")
    state, generation, workspace, _, private, erased_at, _, exists, *_ = row
    if erased_at is not None or not exists:
        raise ReportErased("report_id", f"the reporter of {report_id!r} was erased; nothing to do")
    return FilingState(state), generation, workspace, private


def _refiling(row: tuple[Any, ...]) -> bool:
    """Whether the filing stopped because GitHub refused its content (``CONTENT_REFUSED``):
    nothing was filed, so an edit files the report again."""
    return FilingState(row[0]) is FilingState.STOPPED and row[10] == CONTENT_REFUSED


def _settings(outbox: Outbox, kind: str) -> IssuesSettings:
    adapter = outbox.registry.get(kind).adapter
    if issubclass(adapter, TrackerAdapter):
        return adapter.section_settings()
    return IssuesSettings.load()


# -- submit ------------------------------------------------------------------------------------


def _submit_steps(
    outbox: Outbox,
    report_id: str,
    workspace_id: str,
    reporter_account_id: str,
    title: str,
    text: str,
) -> Generator[Step, Any, Submitted]:
    report_id = _report_id(report_id)
    _text("workspace_id", workspace_id)
    _text("reporter_account_id", reporter_account_id)
    _text("text", text)
    # The kinds' own enqueue checks measure a stored report; this one is not stored yet.
    check_fits(report_id, title, text, 1, ())
    asked = _draft_request(outbox, _draft_context(report_id, 1, workspace_id, text))
    draft = asked if isinstance(asked, ActionRequest) else None
    filing = _generation_request(FILE_ISSUE, report_id, 1, workspace_id)
    # Refused before anything is written: an unknown kind, an invalid request, a kind's own
    # enqueue check.
    yield Check(tuple(request for request in (draft, filing) if request is not None))
    params = {
        "report": report_id,
        "workspace": workspace_id,
        "reporter": reporter_account_id,
        "title": title,
        "text": text,
    }
    inserted = yield Sql("insert_report", params, "one")
    if inserted is None:
        # Submitted before (or by a transaction racing this one, which this insert waited
        # for): one report, one filing, one issue. Nothing changes.
        return Submitted(report_id, 1, created=False)
    yield Sql("insert_filing", params, "none")
    yield Sql("lock_filing", {"report": report_id}, "one")
    # The draft first, then the filing, in one lane: the lane runs them in id order, so
    # FILE_ISSUE starts only after the draft ended (with or without an answer).
    drafted: Enqueued | None = (yield Enqueue(draft)) if draft is not None else None
    filed: Enqueued = yield Enqueue(filing)
    return Submitted(
        report_id,
        1,
        created=True,
        file_action_id=filed.id,
        draft_action_id=drafted.id if drafted is not None else None,
        draft_skipped=asked.reason if isinstance(asked, NoDraft) else None,
    )


def submit_report(
    conn: Connection[Any],
    *,
    report_id: str,
    workspace_id: str,
    reporter_account_id: str,
    title: str,
    text: str,
    outbox: Outbox | None = None,
) -> Submitted:
    """Store a report and enqueue its draft (when outbox-draft is installed) and
    ``FILE_ISSUE``, in ``conn``'s transaction: they exist exactly when it commits.

    A second call for the same report (also one racing this) changes nothing and returns
    ``created=False``. Raises :class:`~outbox_core.InvalidRequest` (nothing written) for an
    invalid field or a kind this build does not serve."""
    outbox = outbox if outbox is not None else default_outbox()
    steps = _submit_steps(outbox, report_id, workspace_id, reporter_account_id, title, text)
    return run_sync(conn, outbox, steps)  # type: ignore[no-any-return]


async def asubmit_report(
    conn: AsyncConnection[Any],
    *,
    report_id: str,
    workspace_id: str,
    reporter_account_id: str,
    title: str,
    text: str,
    outbox: Outbox | None = None,
) -> Submitted:
    """The async twin of :func:`submit_report`."""
    outbox = outbox if outbox is not None else default_outbox()
    steps = _submit_steps(outbox, report_id, workspace_id, reporter_account_id, title, text)
    return await run_async(conn, outbox, steps)  # type: ignore[no-any-return]


# -- edit or re-draft, publish ---------------------------------------------------------------


def _generation_request(
    kind: str, report_id: str, generation: int, workspace: str
) -> ActionRequest:
    """``FILE_ISSUE`` or ``PUBLISH_REPORT`` of one generation of the report."""
    key = (file_key if kind == FILE_ISSUE else publish_key)(report_id, generation)
    return ActionRequest(
        kind=kind,
        lane_key=lane(report_id),
        idempotency_key=key,
        payload={"report": report_id, "generation": generation},
        workspace_id=workspace,
    )


def _require_filed(state: FilingState, report_id: str, what: str, *, refile: bool = False) -> None:
    if state is not FilingState.FILED:
        raise NotFiled(
            "report_id",
            f"{what} needs a filed report; the filing of {report_id!r} is {state}"
            + (
                ": GitHub refused its content (CONTENT_REFUSED), nothing was filed; "
                "edit_report with content that fits files it again"
                if refile
                else ": its FILE_ISSUE stopped, submit the report again under a new id"
                if state is FilingState.STOPPED
                else ": call it again once the filing is FILED"
            ),
        )


def _edit_steps(
    outbox: Outbox, report_id: str, title: str | None, text: str | None
) -> Generator[Step, Any, Submitted]:
    report_id = _report_id(report_id)
    if text is not None:
        _text("text", text)
    row = yield Sql("lock_filing", {"report": report_id}, "one")
    state, generation, workspace, _ = _locked(row, report_id)
    refile = _refiling(row)
    if not refile:
        _require_filed(state, report_id, "an edit or a re-draft")
    following = generation + 1
    stored_title, stored_text, _ = yield Sql("report_content", {"report": report_id}, "one")
    draft_text = text if text is not None else stored_text
    if refile:
        # GitHub refused the content, so nothing was filed: the new generation is filed.
        follow_up = _generation_request(FILE_ISSUE, report_id, following, workspace)
        keys: tuple[str, ...] = ()
    else:
        follow_up = _generation_request(PUBLISH_REPORT, report_id, following, workspace)
        keys = (follow_up.idempotency_key,)
    heading = title if title is not None else stored_title
    check_fits(report_id, heading, draft_text, following, keys)
    asked = _draft_request(outbox, _draft_context(report_id, following, workspace, draft_text))
    draft = asked if isinstance(asked, ActionRequest) else None
    yield Check(tuple(request for request in (draft, follow_up) if request is not None))
    changed = yield Sql(
        "new_generation", {"report": report_id, "title": title, "text": text}, "one"
    )
    yield Sql("filing_generation", {"report": report_id, "generation": changed[0]}, "none")
    if refile:
        yield Sql("refile", {"report": report_id, "reason": CONTENT_REFUSED}, "none")
    # After FILED, a new generation is not filed again: the draft (when installed) and then
    # PUBLISH_REPORT, which edits the existing issue to the new generation.
    drafted: Enqueued | None = (yield Enqueue(draft)) if draft is not None else None
    queued: Enqueued = yield Enqueue(follow_up)
    return Submitted(
        report_id,
        following,
        created=True,
        file_action_id=queued.id if refile else None,
        publish_action_id=None if refile else queued.id,
        draft_action_id=drafted.id if drafted is not None else None,
        draft_skipped=asked.reason if isinstance(asked, NoDraft) else None,
    )


def edit_report(
    conn: Connection[Any],
    report_id: str,
    *,
    title: str | None = None,
    text: str | None = None,
    outbox: Outbox | None = None,
) -> Submitted:
    """Start a new generation of a filed report: new ``title`` and/or ``text``, or neither for
    a re-draft. Enqueues the draft (when installed) and ``PUBLISH_REPORT`` of the new
    generation, which brings the issue to it. Refused (:class:`NotFiled`) unless FILED, or
    STOPPED with ``CONTENT_REFUSED`` (GitHub refused the issue: nothing was filed), which
    files the new generation (``FILE_ISSUE``) instead."""
    outbox = outbox if outbox is not None else default_outbox()
    return run_sync(conn, outbox, _edit_steps(outbox, report_id, title, text))  # type: ignore[no-any-return]


async def aedit_report(
    conn: AsyncConnection[Any],
    report_id: str,
    *,
    title: str | None = None,
    text: str | None = None,
    outbox: Outbox | None = None,
) -> Submitted:
    """The async twin of :func:`edit_report`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await run_async(conn, outbox, _edit_steps(outbox, report_id, title, text))  # type: ignore[no-any-return]


def _publish_steps(outbox: Outbox, report_id: str) -> Generator[Step, Any, Submitted]:
    report_id = _report_id(report_id)
    row = yield Sql("lock_filing", {"report": report_id}, "one")
    state, generation, workspace, _ = _locked(row, report_id)
    _require_filed(state, report_id, "/publish", refile=_refiling(row))
    published: Enqueued = yield Enqueue(
        _generation_request(PUBLISH_REPORT, report_id, generation, workspace)
    )
    return Submitted(report_id, generation, published.created, publish_action_id=published.id)


def publish_report(
    conn: Connection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Submitted:
    """``/publish``: bring the filed issue to the report's current generation (title, body,
    labels). Refused (:class:`NotFiled`) unless the filing is FILED."""
    outbox = outbox if outbox is not None else default_outbox()
    return run_sync(conn, outbox, _publish_steps(outbox, report_id))  # type: ignore[no-any-return]


async def apublish_report(
    conn: AsyncConnection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Submitted:
    """The async twin of :func:`publish_report`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await run_async(conn, outbox, _publish_steps(outbox, report_id))  # type: ignore[no-any-return]


def _private_steps(outbox: Outbox, report_id: str) -> Generator[Step, Any, Submitted]:
    report_id = _report_id(report_id)
    if _settings(outbox, TRANSFER_ISSUE).private_repository is None:
        raise NotConfigured(
            "report_id",
            "Make private needs OUTBOX_ISSUES_PRIVATE_REPOSITORY (owner/name) to move the issue to",
        )
    row = yield Sql("lock_filing", {"report": report_id}, "one")
    state, generation, workspace, _ = _locked(row, report_id)
    _require_filed(state, report_id, "Make private", refile=_refiling(row))
    request = ActionRequest(
        kind=TRANSFER_ISSUE,
        lane_key=lane(report_id),
        idempotency_key=transfer_key(report_id),
        payload={"report": report_id},
        workspace_id=workspace,
    )
    moved: Enqueued = yield Enqueue(request)
    return Submitted(report_id, generation, moved.created, transfer_action_id=moved.id)


def make_private(
    conn: Connection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Submitted:
    """**Make private**: move the filed issue to the private repository (``TRANSFER_ISSUE``).
    The filing keeps the new number and URL. Refused unless FILED and configured."""
    outbox = outbox if outbox is not None else default_outbox()
    return run_sync(conn, outbox, _private_steps(outbox, report_id))  # type: ignore[no-any-return]


async def amake_private(
    conn: AsyncConnection[Any], report_id: str, *, outbox: Outbox | None = None
) -> Submitted:
    """The async twin of :func:`make_private`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await run_async(conn, outbox, _private_steps(outbox, report_id))  # type: ignore[no-any-return]
