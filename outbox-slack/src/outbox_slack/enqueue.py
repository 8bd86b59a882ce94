"""Post a turn from the application's transaction: store its admitted entries and enqueue its
one ``SLACK_POST``, both exactly when that transaction commits.

Only this entry point enqueues a ``SLACK_POST``; a turn notification never does. So a late
notification cannot repeat a post that redaction removed: a turn whose entries are stored is
refused even once its action is gone (:class:`~outbox_slack.TurnAlreadyPosted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import ActionRequest, Enqueued, InvalidRequest, Outbox, default_outbox
from outbox_core.steps import Query, Steps, arun, atomic, run

from .adapter import KIND, SlackPost, idempotency_key, lane_key
from .domain import ENTRY_KINDS, Entry, queries
from .errors import TurnAlreadyPosted
from .message import check_length


@dataclass(frozen=True, slots=True)
class _Turn:
    request: ActionRequest
    insert_turn: dict[str, Any]
    entries: dict[str, Any]


def _check(
    turn_id: str,
    workspace_id: str,
    entries: Sequence[Entry],
    subject_account_id: str | None,
    max_attempts: int | None,
    expires_at: datetime | None,
) -> _Turn:
    if not isinstance(turn_id, str) or not turn_id:
        raise InvalidRequest("turn_id", "name the turn (a non-empty string)")
    if not isinstance(workspace_id, str) or not workspace_id:
        raise InvalidRequest("workspace_id", "a Slack post belongs to a workspace; name it")
    if not entries:
        raise InvalidRequest("entries", f"turn {turn_id!r} has no admitted entry to post")
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"entries[{index}]"
        if not isinstance(entry, Entry):
            raise InvalidRequest(where, f"expected an outbox_slack.Entry, got {entry!r}")
        if not entry.entry_id or entry.entry_id in seen:
            raise InvalidRequest(where, f"entry ids are non-empty and unique: {entry.entry_id!r}")
        seen.add(entry.entry_id)
        if entry.kind not in ENTRY_KINDS:
            raise InvalidRequest(where, f"kind is 'question' or 'digest', not {entry.kind!r}")
        if not entry.text.strip():
            raise InvalidRequest(where, f"entry {entry.entry_id!r} has no text to post")
        if not entry.channel:
            raise InvalidRequest(where, f"entry {entry.entry_id!r} names no channel")
    first = entries[0]
    for index, entry in enumerate(entries):
        if (entry.channel, entry.thread_ts) != (first.channel, first.thread_ts):
            raise InvalidRequest(
                f"entries[{index}]",
                f"one turn is one message: entry {entry.entry_id!r} goes to "
                f"{entry.channel}/{entry.thread_ts}, the turn's first to "
                f"{first.channel}/{first.thread_ts}",
            )
    check_length(turn_id, [entry.text for entry in entries])
    key = idempotency_key(turn_id)
    payload = SlackPost(turn_id=turn_id, entry_ids=[entry.entry_id for entry in entries])
    request = ActionRequest(
        kind=KIND,
        lane_key=lane_key(first.channel, first.thread_ts),
        idempotency_key=key,
        payload=payload,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    return _Turn(
        request,
        {
            "turn_id": turn_id,
            "workspace_id": workspace_id,
            "channel": first.channel,
            "thread_ts": first.thread_ts,
            "subject": subject_account_id,
            "key": key,
        },
        {
            "turn_id": turn_id,
            "ids": [entry.entry_id for entry in entries],
            "kinds": [entry.kind for entry in entries],
            "positions": list(range(len(entries))),
            "channels": [entry.channel for entry in entries],
            "texts": [entry.text for entry in entries],
        },
    )


def _stored_before(turn_id: str, row: tuple[Any, ...] | None) -> Enqueued:
    if row is not None and row[1] is not None:
        return Enqueued(id=row[1], created=False)
    raise TurnAlreadyPosted(
        "turn_id",
        f"turn {turn_id!r} was posted before and its post was removed (its entries were "
        "redacted or its subject erased); it is never posted again. Nothing was enqueued",
    )


def _taken(rows: list[tuple[Any, ...]]) -> InvalidRequest:
    taken = ", ".join(f"{entry!r} (turn {turn!r})" for entry, turn in rows)
    return InvalidRequest("entries", f"entries already stored with another turn: {taken}")


def post_turn_steps(
    outbox: Outbox,
    turn_id: str,
    entries: Sequence[Entry],
    *,
    workspace_id: str,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
) -> Steps[Enqueued]:
    """:func:`post_turn` as steps (``yield from`` it in an operation of your own)."""
    turn = _check(turn_id, workspace_id, entries, subject_account_id, max_attempts, expires_at)
    sql = queries(outbox.schema)
    if not (yield Query(sql["insert_turn"], turn.insert_turn)):
        rows = yield Query(sql["posted_turn"], turn.insert_turn)
        return _stored_before(turn_id, rows[0] if rows else None)
    taken = yield Query(sql["taken_entries"], turn.entries)
    if taken:
        raise _taken(taken)
    # The entries before the action: the kind's enqueue check reads what the post will send.
    yield Query(sql["insert_entries"], turn.entries)
    enqueued = yield from outbox.enqueue_steps(turn.request)
    yield Query(sql["set_turn_action"], {"turn_id": turn_id, "action_id": enqueued.id})
    return enqueued


def post_turn(
    conn: Connection[Any],
    turn_id: str,
    entries: Sequence[Entry],
    *,
    workspace_id: str,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    outbox: Outbox | None = None,
) -> Enqueued:
    """Store the turn's admitted ``entries`` and enqueue its one ``SLACK_POST`` in ``conn``'s
    transaction (lane: the channel, or the thread; idempotency key: ``slack_post:<turn_id>``).

    Posting the same turn again returns the first action and stores nothing (also when two
    transactions post it at once: the second waits for the first). A turn whose post was
    removed raises :class:`~outbox_slack.TurnAlreadyPosted`. ``subject_account_id`` is the
    account the turn addresses, if any: erasing it deletes the turn, its entries and its post.
    A turn that is not one message Slack keeps whole (over 40,000 characters, entries joined by
    a blank line: :mod:`outbox_slack.message`) raises :class:`~outbox_core.InvalidRequest`.
    A refused turn writes nothing: the steps run in a savepoint of ``conn``'s transaction.
    """
    steps = post_turn_steps(
        outbox if outbox is not None else default_outbox(),
        turn_id,
        entries,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    return run(conn, atomic(steps))


async def apost_turn(
    conn: AsyncConnection[Any],
    turn_id: str,
    entries: Sequence[Entry],
    *,
    workspace_id: str,
    subject_account_id: str | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    outbox: Outbox | None = None,
) -> Enqueued:
    """The async twin of :func:`post_turn`."""
    steps = post_turn_steps(
        outbox if outbox is not None else default_outbox(),
        turn_id,
        entries,
        workspace_id=workspace_id,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    return await arun(conn, atomic(steps))
