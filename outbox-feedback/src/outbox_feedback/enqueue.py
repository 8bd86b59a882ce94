"""The application's entry points, in the caller's transaction, sync and async, each written
once as steps (:mod:`outbox_core.steps`).

- :func:`create_feedback`, :func:`decide`, :func:`mark`, :func:`retract`: the feedback's
  decided content and marks; each raises the feedback's revision.
- their checks of a feedback id and its lock's answer, which :mod:`outbox_feedback.send_queue`
  shares (its :class:`~outbox_feedback.send_queue.FeedbackSendQueue` queues the send).

Every function takes the feedback's row lock first, so the sends of one feedback are queued in
the order its decisions commit. Payloads hold identifiers only (``{"feedback": <id>}``); the
adapters read the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import (
    InvalidRequest,
    Outbox,
    default_outbox,
)
from outbox_core.steps import Query, Steps, arun, run
from outbox_issues import limits

from .copies import SUMMARY, Item, check_copies
from .domain import FEEDBACK_ID, Feedback, queries, send_key
from .errors import FeedbackRetracted, UnknownFeedback

LONGEST_SEND = 2**31 - 1
"""The highest send number a feedback's key can carry (``feedback.sends`` is an integer): a
copy's body is measured with that key's marker, the longest any send of it writes."""


# -- checks ------------------------------------------------------------------------------------


def checked_feedback_id(value: object) -> str:
    """``value`` as a feedback id, or :class:`InvalidRequest` naming ``feedback_id``."""
    if not isinstance(value, str) or not FEEDBACK_ID.match(value):
        raise InvalidRequest(
            "feedback_id", "use 1-100 letters, digits, '.', '_' or '-' (it names lanes and keys)"
        )
    return value


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not limits.visible(value):
        raise InvalidRequest(
            field, "must hold a visible character (not only spaces or invisible characters)"
        )
    return value


def _fits(feedback_id: str, summary: str | None, items: Sequence[Item] | None) -> None:
    """Refuse what a later send could not write whole (:func:`copies.check_copies`), before
    the feedback is stored: measured with the longest key a send of it can carry, and each
    item as if marked resolved (a mark adds ``**Resolved.**``)."""
    resolved = [replace(item, resolved=True) for item in items or ()]
    check_copies(feedback_id, summary, resolved, send_key(feedback_id, LONGEST_SEND))


def _items(items: Sequence[Item]) -> list[Item]:
    checked: list[Item] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        where = f"items[{index}]"
        if not isinstance(item, Item):
            raise InvalidRequest(
                where, f"expected an outbox_feedback.Item, got {type(item).__name__}"
            )
        if not FEEDBACK_ID.match(item.item_id) or item.item_id == SUMMARY:
            raise InvalidRequest(
                f"{where}.item_id", f"use 1-100 letters, digits, '.', '_' or '-', not {SUMMARY!r}"
            )
        if item.item_id in seen:
            raise InvalidRequest(f"{where}.item_id", f"{item.item_id!r} is used twice")
        seen.add(item.item_id)
        _text(f"{where}.path", item.path)
        _text(f"{where}.body", item.body)
        if not isinstance(item.commit_id, str) or not item.commit_id.strip():
            raise InvalidRequest(f"{where}.commit_id", "name the commit the line is in (its SHA)")
        if isinstance(item.line, bool) or not isinstance(item.line, int) or item.line < 1:
            raise InvalidRequest(f"{where}.line", "must be a line number of at least 1")
        if item.side not in ("LEFT", "RIGHT"):
            raise InvalidRequest(f"{where}.side", "must be 'LEFT' (deletions) or 'RIGHT'")
        checked.append(item)
    return checked


def locked_row(row: list[tuple[Any, ...]], feedback_id: str) -> tuple[Any, ...]:
    """The feedback's row from ``lock_feedback``'s answer, or :class:`UnknownFeedback`."""
    if not row:
        raise UnknownFeedback("feedback_id", f"no feedback {feedback_id!r} was stored")
    return row[0]


def _write_items(named: dict[str, str], feedback_id: str, items: list[Item]) -> Steps[None]:
    yield Query(named["clear_items"], {"feedback": feedback_id})
    for ordinal, item in enumerate(items):
        yield Query(
            named["insert_item"],
            {
                "feedback": feedback_id,
                "item": item.item_id,
                "ordinal": ordinal,
                "path": item.path,
                "commit_id": item.commit_id,
                "line": item.line,
                "side": item.side,
                "body": item.body,
                "resolved": item.resolved,
            },
        )


# -- the feedback ------------------------------------------------------------------------------


def create_feedback_steps(
    outbox: Outbox,
    feedback_id: str,
    *,
    workspace_id: str,
    author_account_id: str,
    repository: str,
    pull_number: int,
    summary: str,
    items: Sequence[Item] = (),
) -> Steps[bool]:
    """:func:`create_feedback` as steps."""
    feedback_id = checked_feedback_id(feedback_id)
    _text("workspace_id", workspace_id)
    _text("author_account_id", author_account_id)
    from outbox_issues.settings import REPOSITORY

    if not isinstance(repository, str) or not REPOSITORY.match(repository):
        raise InvalidRequest("repository", "use owner/name, e.g. 'acme/app'")
    if isinstance(pull_number, bool) or not isinstance(pull_number, int) or pull_number < 1:
        raise InvalidRequest("pull_number", "must be a pull request number of at least 1")
    _text("summary", summary)
    checked = _items(items)
    _fits(feedback_id, summary, checked)
    named = queries(outbox.schema)
    inserted = yield Query(
        named["insert_feedback"],
        {
            "feedback": feedback_id,
            "workspace": workspace_id,
            "author": author_account_id,
            "repository": repository,
            "pull": pull_number,
            "summary": summary,
        },
    )
    if not inserted:
        return False
    yield from _write_items(named, feedback_id, checked)
    return True


def create_feedback(
    conn: Connection[Any],
    feedback_id: str,
    *,
    workspace_id: str,
    author_account_id: str,
    repository: str,
    pull_number: int,
    summary: str,
    items: Sequence[Item] = (),
    outbox: Outbox | None = None,
) -> bool:
    """Store a feedback on a pull request in ``conn``'s transaction: its workspace, the author
    of the reviewed work (person data: the sends' subject), the repository (``owner/name``) and
    pull request, the summary and the inline items. False when it was stored before (nothing
    changes then). Queue its first send with :meth:`FeedbackSendQueue.queue` in the same
    transaction. Invalid input raises :class:`~outbox_core.InvalidRequest`, writing nothing."""
    outbox = outbox if outbox is not None else default_outbox()
    steps = create_feedback_steps(
        outbox,
        feedback_id,
        workspace_id=workspace_id,
        author_account_id=author_account_id,
        repository=repository,
        pull_number=pull_number,
        summary=summary,
        items=items,
    )
    return run(conn, steps)


async def acreate_feedback(
    conn: AsyncConnection[Any],
    feedback_id: str,
    *,
    workspace_id: str,
    author_account_id: str,
    repository: str,
    pull_number: int,
    summary: str,
    items: Sequence[Item] = (),
    outbox: Outbox | None = None,
) -> bool:
    """The async twin of :func:`create_feedback`."""
    outbox = outbox if outbox is not None else default_outbox()
    steps = create_feedback_steps(
        outbox,
        feedback_id,
        workspace_id=workspace_id,
        author_account_id=author_account_id,
        repository=repository,
        pull_number=pull_number,
        summary=summary,
        items=items,
    )
    return await arun(conn, steps)


def _open_feedback_steps(named: dict[str, str], feedback_id: str) -> Steps[tuple[Any, ...]]:
    row = locked_row((yield Query(named["lock_feedback"], {"feedback": feedback_id})), feedback_id)
    if row[3] is not None:
        raise FeedbackRetracted("feedback_id", f"feedback {feedback_id!r} was retracted")
    return row


def decide_steps(
    outbox: Outbox,
    feedback_id: str,
    *,
    summary: str | None = None,
    items: Sequence[Item] | None = None,
) -> Steps[int]:
    """:func:`decide` as steps."""
    feedback_id = checked_feedback_id(feedback_id)
    if summary is not None:
        _text("summary", summary)
    checked = _items(items) if items is not None else None
    _fits(feedback_id, summary, checked)
    named = queries(outbox.schema)
    row = yield from _open_feedback_steps(named, feedback_id)
    if summary is not None:
        yield Query(named["decide_summary"], {"feedback": feedback_id, "summary": summary})
    if checked is not None:
        yield from _write_items(named, feedback_id, checked)
    if summary is None:
        yield Query(named["bump_revision"], {"feedback": feedback_id})
    return int(row[2]) + 1


def decide(
    conn: Connection[Any],
    feedback_id: str,
    *,
    summary: str | None = None,
    items: Sequence[Item] | None = None,
    outbox: Outbox | None = None,
) -> int:
    """A new decision: the ``summary`` and/or the inline ``items`` (the whole list, which
    replaces the last one). Returns the new revision. Queue its send in the same transaction."""
    outbox = outbox if outbox is not None else default_outbox()
    return run(conn, decide_steps(outbox, feedback_id, summary=summary, items=items))


async def adecide(
    conn: AsyncConnection[Any],
    feedback_id: str,
    *,
    summary: str | None = None,
    items: Sequence[Item] | None = None,
    outbox: Outbox | None = None,
) -> int:
    """The async twin of :func:`decide`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await arun(conn, decide_steps(outbox, feedback_id, summary=summary, items=items))


def mark_steps(outbox: Outbox, feedback_id: str, item_id: str, *, resolved: bool) -> Steps[int]:
    """:func:`mark` as steps."""
    feedback_id = checked_feedback_id(feedback_id)
    named = queries(outbox.schema)
    row = yield from _open_feedback_steps(named, feedback_id)
    marked = yield Query(
        named["mark_item"], {"feedback": feedback_id, "item": item_id, "resolved": bool(resolved)}
    )
    if not marked:
        raise InvalidRequest("item_id", f"feedback {feedback_id!r} has no item {item_id!r}")
    yield Query(named["bump_revision"], {"feedback": feedback_id})
    return int(row[2]) + 1


def mark(
    conn: Connection[Any],
    feedback_id: str,
    item_id: str,
    *,
    resolved: bool = True,
    outbox: Outbox | None = None,
) -> int:
    """Mark an inline item resolved (or not). Returns the new revision."""
    outbox = outbox if outbox is not None else default_outbox()
    return run(conn, mark_steps(outbox, feedback_id, item_id, resolved=resolved))


async def amark(
    conn: AsyncConnection[Any],
    feedback_id: str,
    item_id: str,
    *,
    resolved: bool = True,
    outbox: Outbox | None = None,
) -> int:
    """The async twin of :func:`mark`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await arun(conn, mark_steps(outbox, feedback_id, item_id, resolved=resolved))


def retract_steps(outbox: Outbox, feedback_id: str) -> Steps[int]:
    """:func:`retract` as steps."""
    feedback_id = checked_feedback_id(feedback_id)
    named = queries(outbox.schema)
    row = locked_row((yield Query(named["lock_feedback"], {"feedback": feedback_id})), feedback_id)
    if row[3] is not None:
        return int(row[2])
    yield Query(named["retract"], {"feedback": feedback_id})
    return int(row[2]) + 1


def retract(conn: Connection[Any], feedback_id: str, *, outbox: Outbox | None = None) -> int:
    """Retract the feedback: its next send deletes every copy. Returns the new revision (a
    second retract changes nothing)."""
    outbox = outbox if outbox is not None else default_outbox()
    return run(conn, retract_steps(outbox, feedback_id))


async def aretract(
    conn: AsyncConnection[Any], feedback_id: str, *, outbox: Outbox | None = None
) -> int:
    """The async twin of :func:`retract`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await arun(conn, retract_steps(outbox, feedback_id))


def read_feedback_steps(outbox: Outbox, feedback_id: str) -> Steps[Feedback | None]:
    named = queries(outbox.schema)
    rows = yield Query(named["feedback_view"], {"feedback": feedback_id})
    if not rows:
        return None
    copies = yield Query(named["copies_view"], {"feedback": feedback_id})
    return Feedback.from_rows(rows[0], copies)


def get_feedback(
    conn: Connection[Any], feedback_id: str, *, outbox: Outbox | None = None
) -> Feedback | None:
    """The feedback with its copies, or None."""
    outbox = outbox if outbox is not None else default_outbox()
    return run(conn, read_feedback_steps(outbox, feedback_id))


async def aget_feedback(
    conn: AsyncConnection[Any], feedback_id: str, *, outbox: Outbox | None = None
) -> Feedback | None:
    """The async twin of :func:`get_feedback`."""
    outbox = outbox if outbox is not None else default_outbox()
    return await arun(conn, read_feedback_steps(outbox, feedback_id))


# -- the send queue ----------------------------------------------------------------------------
