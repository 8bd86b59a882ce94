"""The domain SLACK_POST posts from: turns and their admitted entries (a question or a digest).

- A turn is stored with its entries by :func:`~outbox_slack.post_turn`, which enqueues its one
  ``SLACK_POST`` in the same transaction.
- The action's ending stores the post's message reference on the entries (what a later reply
  needs to open a thread), and removes the action when every entry was redacted meanwhile.
- :func:`redact` removes an entry's text; once every entry of its turn is redacted, the turn's
  ended action is removed in the same transaction, so it goes exactly when the redaction
  commits (the action stays while any entry is unredacted: a late redelivery of the turn still
  finds its idempotency key, and the 30-day sweep never removes it).
- :class:`SlackPersonData` erases a subject's turns and entries (the core deletes the actions).

Both the ending and a redaction take the turn's row lock first, so whichever commits second
sees the first: an action is never left behind by a redaction that commits while it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from psycopg import AsyncConnection, Connection

from outbox_core import (
    Action,
    ActionState,
    Outbox,
    default_outbox,
    erasing_outbox,
    package_queries,
)
from outbox_core.steps import Query, Steps, arun, run

from .errors import UnknownEntry

EntryKind = Literal["question", "digest"]
ENTRY_KINDS: tuple[EntryKind, ...] = ("question", "digest")


def queries(schema: str) -> dict[str, str]:
    """outbox-slack's named statements with the schema filled in."""
    return package_queries("outbox_slack", "queries.sql", schema)


@dataclass(frozen=True, slots=True)
class Entry:
    """One admitted entry of a turn: a question or a digest, with the text to post.

    Every entry of a turn names the same ``channel`` (a conversation ID such as ``C0123``, which
    the read-back needs) and ``thread_ts`` (None: a top-level message)."""

    entry_id: str
    kind: EntryKind
    channel: str
    text: str
    thread_ts: str | None = None


@dataclass(frozen=True, slots=True)
class Redacted:
    """What :func:`redact` did: whether the entry's text was removed now (False: it was
    already), and whether the turn's ended action was removed with it."""

    entry_id: str
    redacted: bool
    action_removed: bool


def parse_ref(readback_ref: str | None) -> tuple[str, str] | None:
    """(channel, ts) from a ``SLACK_POST``'s ``readback_ref`` (``C0123:1700000000.000100``)."""
    if not readback_ref or ":" not in readback_ref:
        return None
    channel, _, ts = readback_ref.rpartition(":")
    return (channel, ts) if channel and ts else None


def message_ref(channel: str, ts: str) -> str:
    return f"{channel}:{ts}"


async def on_ended(conn: AsyncConnection[Any], schema: str, action: Action) -> None:
    """The ``ended`` hook's work, in the transaction that ended ``action``."""
    sql = queries(schema)
    cursor = await conn.execute(sql["lock_turn_of_action"], {"action_id": action.id})
    row = await cursor.fetchone()
    if row is None:
        return  # the turn was erased, or the action was not enqueued by post_turn
    turn_id = row[0]
    await conn.execute(sql["clear_readback"], {"turn_id": turn_id})
    ref = parse_ref(action.readback_ref) if action.state is ActionState.DONE else None
    if ref is not None:
        await conn.execute(
            sql["store_message_ref"], {"turn_id": turn_id, "channel": ref[0], "ts": ref[1]}
        )
    cursor = await conn.execute(sql["unredacted_left"], {"turn_id": turn_id})
    left = await cursor.fetchone()
    if left is not None and left[0] == 0:
        # Redacted while it was live: its ending removes it (the settle statement that ended
        # it ran before this hook, and nothing after the hook reads the row).
        await conn.execute(sql["remove_ended_action"], {"turn_id": turn_id, "action_id": action.id})


def redact_steps(outbox: Outbox, entry_id: str) -> Steps[Redacted]:
    """:func:`redact` as steps (``yield from`` it in an operation of your own)."""
    sql = queries(outbox.schema)
    rows = yield Query(sql["lock_turn_of_entry"], {"entry_id": entry_id})
    if not rows:
        raise UnknownEntry(f"entry {entry_id!r}: no stored entry has this id; nothing was redacted")
    turn_id, action_id = rows[0]
    redacted = bool((yield Query(sql["redact_entry"], {"entry_id": entry_id})))
    left = yield Query(sql["unredacted_left"], {"turn_id": turn_id})
    removed = False
    if action_id is not None and left[0][0] == 0:
        params = {"turn_id": turn_id, "action_id": action_id}
        removed = bool((yield Query(sql["remove_ended_action"], params)))
    return Redacted(entry_id, redacted, removed)


def redact(conn: Connection[Any], entry_id: str, *, outbox: Outbox | None = None) -> Redacted:
    """Remove the entry's text in ``conn``'s transaction. Once every entry of its turn is
    redacted, the turn's ended ``SLACK_POST`` is removed in the same transaction (the entries
    keep its outcome and message reference); a live one is removed by its ending.

    Raises :class:`~outbox_slack.UnknownEntry` when no entry has this id."""
    return run(conn, redact_steps(outbox if outbox is not None else default_outbox(), entry_id))


async def aredact(
    conn: AsyncConnection[Any], entry_id: str, *, outbox: Outbox | None = None
) -> Redacted:
    """The async twin of :func:`redact`."""
    steps = redact_steps(outbox if outbox is not None else default_outbox(), entry_id)
    return await arun(conn, steps)


class SlackPersonData:
    """The person-data catalog of outbox-slack: a subject's turns and their entries (the
    entries' text). The core's erasure deletes the subject's actions first."""

    name = "slack"

    def __init__(self, schema: str | None = None) -> None:
        self._schema = schema

    async def erase(self, conn: AsyncConnection[Any], subject_account_id: str) -> int:
        # The schema of the erasure that runs this catalog (an application's Outbox, or the
        # command's --schema), never the environment's default.
        schema = self._schema if self._schema is not None else erasing_outbox().schema
        sql = queries(schema)
        cursor = await conn.execute(sql["erase_subject"], {"subject": subject_account_id})
        return cursor.rowcount
