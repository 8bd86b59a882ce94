"""Erasure of a person: their actions, and every package's person data, in one transaction;
and its dry run, the same erasure rolled back, which says what it would delete per table."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from .errors import InvalidRequest, OutboxError
from .lane_locks import LockAgain, lanes_first
from .observability import event
from .outbox import Outbox, default_outbox
from .states import LIVE_STATES

# The Outbox of the erasure whose catalogs are running (see erasing_outbox).
_erasing: ContextVar[Outbox | None] = ContextVar("outbox_erasing", default=None)


def erasing_outbox() -> Outbox:
    """For a :class:`PersonDataCatalog`: the Outbox (schema, kinds) of the erasure that is
    calling it, so that it can cancel or enqueue actions in the erasure's transaction."""
    outbox = _erasing.get()
    return default_outbox() if outbox is None else outbox


# The states that hold a place in a lane: every live one (a proposal holds its lane until it
# is admitted or refused).
_IN_A_LANE = frozenset(str(state) for state in LIVE_STATES)


@dataclass(frozen=True, slots=True)
class TableRows:
    """What an erasure's statements did to one table's rows, as PostgreSQL counts them: rows
    deleted, updated (a scrubbed text, a cancelled action) and inserted (an enqueued cleanup).
    A row updated twice counts twice."""

    deleted: int
    updated: int
    inserted: int

    def as_dict(self) -> dict[str, int]:
        return {"deleted": self.deleted, "updated": self.updated, "inserted": self.inserted}


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """How many actions were deleted, what each catalog erased, and per table (``schema.table``)
    the rows that the erasure's statements deleted, updated and inserted: the core's tables and
    every catalog's, counted from the statements themselves, not from a list of tables. Empty
    when the server counts nothing (``track_counts`` off)."""

    actions: int
    catalogs: dict[str, int]
    tables: dict[str, TableRows] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "actions": self.actions,
            "catalogs": dict(self.catalogs),
            "tables": {name: rows.as_dict() for name, rows in sorted(self.tables.items())},
        }


async def erase_subject(
    conn: AsyncConnection[Any],
    subject_account_id: str,
    *,
    outbox: Outbox | None = None,
    lock_wait_seconds: float = 30.0,
) -> ErasureReport:
    """Delete every action addressed to the subject and erase every package's person data,
    in ``conn``'s current transaction (the caller commits).

    A pending action is then never carried out: its row is gone, so no claim finds it and
    its fence refuses. A write that already passed its fence still reaches the provider, as it
    would have a moment earlier. The lanes of deleted actions are looked at again so that the
    actions behind a deleted head do not wait.

    The actions' lanes are taken before the actions, and an action that another transaction
    holds (a running attempt's transaction, an ending) is waited for without holding the
    lanes (see :mod:`outbox_core.lane_locks`), for up to ``lock_wait_seconds``; then
    :class:`~outbox_core.lane_locks.LocksBusy` is raised and nothing was deleted.
    """
    report = await _erase(conn, subject_account_id, outbox, lock_wait_seconds)
    event("erasure.done", actions=report.actions, catalogs=",".join(sorted(report.catalogs)))
    return report


async def preview_erasure(
    conn: AsyncConnection[Any],
    subject_account_id: str,
    *,
    outbox: Outbox | None = None,
    lock_wait_seconds: float = 30.0,
) -> ErasureReport:
    """What :func:`erase_subject` would delete now, deleting nothing: the same erasure, every
    catalog included, run inside a savepoint of ``conn``'s transaction (a transaction of its own
    when none is open) that is then rolled back. Its counts are the erasure's own statements',
    so a catalog is counted the way it erases, with no second list of tables to keep.

    As the erasure does, it takes the subject's lanes and actions for its moment, and waits for
    busy rows up to ``lock_wait_seconds`` (then :class:`~outbox_core.lane_locks.LocksBusy`).
    Raises :class:`~outbox_core.errors.OutboxError` when the server counts no rows
    (``track_counts`` off), rather than report that nothing would go."""
    outbox = outbox if outbox is not None else default_outbox()
    async with conn.transaction(force_rollback=True):
        cursor = await conn.execute(outbox.queries["counts_rows_written"])
        row = await cursor.fetchone()
        if not (row and row[0]):
            raise OutboxError(
                "the dry run counts the erasure's rows with PostgreSQL's statistics, and this "
                "server has track_counts off: turn it on (a superuser's setting) to see the counts"
            )
        return await _erase(conn, subject_account_id, outbox, lock_wait_seconds)


async def _rows_written(conn: AsyncConnection[Any], outbox: Outbox) -> dict[str, TableRows]:
    cursor = await conn.execute(outbox.queries["rows_written_in_transaction"])
    return {row[0]: TableRows(row[1], row[2], row[3]) for row in await cursor.fetchall()}


def _difference(before: dict[str, TableRows], after: dict[str, TableRows]) -> dict[str, TableRows]:
    zero = TableRows(0, 0, 0)
    changed = {}
    for name, rows in after.items():
        was = before.get(name, zero)
        done = TableRows(
            rows.deleted - was.deleted, rows.updated - was.updated, rows.inserted - was.inserted
        )
        if done != zero:
            changed[name] = done
    return changed


async def _erase(
    conn: AsyncConnection[Any],
    subject_account_id: str,
    outbox: Outbox | None,
    lock_wait_seconds: float,
) -> ErasureReport:
    outbox = outbox if outbox is not None else default_outbox()
    if not isinstance(subject_account_id, str) or not subject_account_id:
        raise InvalidRequest("subject_account_id", "name the account to erase")
    params = {"subject": subject_account_id}
    # What this transaction had written before: the erasure reports only its own rows.
    before = await _rows_written(conn, outbox)

    async def delete_actions() -> list[tuple[Any, ...]]:
        cursor = await conn.execute(outbox.queries["lock_subject_lanes"], params)
        locked = {row[0] for row in await cursor.fetchall()}
        cursor = await conn.execute(outbox.queries["lock_subject_actions"], params)
        actions = await cursor.fetchall()
        # A live action in a lane not taken above was enqueued meanwhile: start again, taking
        # its lane too, rather than wait for that lane while holding rows. A lane that has no
        # row (a proposal that an older build enqueued alone in its lane) has nothing to take.
        untaken = sorted({row[1] for row in actions if row[2] in _IN_A_LANE} - locked)
        if untaken:
            cursor = await conn.execute(outbox.queries["lane_rows"], {"lanes": untaken})
            if await cursor.fetchall():
                raise LockAgain
        ids = [row[0] for row in actions]
        cursor = await conn.execute(outbox.queries["erase_actions"], {"ids": ids})
        deleted = await cursor.fetchall()
        # The lanes whose live actions were deleted (each taken above) are looked at again,
        # so that the actions behind a deleted head do not wait.
        lanes = sorted({row[2] for row in deleted if row[3] in _IN_A_LANE} & locked)
        if lanes:
            await conn.execute(outbox.queries["lower_lanes_wait"], {"lanes": lanes})
        # The lanes left with no live action go: their keys may name the subject.
        emptied = sorted({row[2] for row in deleted} & locked)
        if emptied:
            await conn.execute(outbox.queries["drop_idle_lanes"], {"lanes": emptied})
        return deleted

    deleted = await lanes_first(
        conn,
        delete_actions,
        what=f"erasure of {subject_account_id!r}",
        wait_seconds=lock_wait_seconds,
    )
    erased: dict[str, int] = {}
    token = _erasing.set(outbox)
    try:
        for catalog in outbox.host.person_data:
            erased[catalog.name] = await catalog.erase(conn, subject_account_id)
    finally:
        _erasing.reset(token)
    tables = _difference(before, await _rows_written(conn, outbox))
    return ErasureReport(actions=len(deleted), catalogs=erased, tables=tables)
