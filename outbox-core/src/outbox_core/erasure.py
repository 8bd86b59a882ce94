"""Erasure of a person: their actions, and every package's person data, in one transaction."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from psycopg import AsyncConnection

from .errors import InvalidRequest
from .lane_locks import LockAgain, lanes_first
from .observability import event

if TYPE_CHECKING:
    from .outbox import Outbox


# The Outbox of the erasure whose catalogs are running (see erasing_outbox).
_erasing: ContextVar[Outbox | None] = ContextVar("outbox_erasing", default=None)


def erasing_outbox() -> Outbox:
    """For a :class:`PersonDataCatalog`: the Outbox (schema, kinds) of the erasure that is
    calling it, so that it can cancel or enqueue actions in the erasure's transaction."""
    outbox = _erasing.get()
    if outbox is None:
        from .outbox import default_outbox

        return default_outbox()
    return outbox


# The states that hold a place in a lane (a PROPOSED action holds none).
_IN_A_LANE = ("ADMITTED", "EXECUTING")


@runtime_checkable
class PersonDataCatalog(Protocol):
    """What a package erases for a subject. Registered with ``outbox_register_person_data``."""

    name: str

    async def erase(self, conn: AsyncConnection[Any], subject_account_id: str) -> int:
        """Delete the subject's rows in ``conn``'s transaction; return how many."""
        ...


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """How many actions were deleted, and what each catalog erased."""

    actions: int
    catalogs: dict[str, int]


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
    from .outbox import default_outbox

    outbox = outbox if outbox is not None else default_outbox()
    if not isinstance(subject_account_id, str) or not subject_account_id:
        raise InvalidRequest("subject_account_id", "name the account to erase")
    params = {"subject": subject_account_id}

    async def delete_actions() -> list[tuple[Any, ...]]:
        cursor = await conn.execute(outbox.queries["lock_subject_lanes"], params)
        locked = {row[0] for row in await cursor.fetchall()}
        cursor = await conn.execute(outbox.queries["lock_subject_actions"], params)
        actions = await cursor.fetchall()
        # A live action in a lane not taken above was enqueued meanwhile: start again, taking
        # its lane too, rather than wait for that lane while holding rows.
        if any(row[1] not in locked for row in actions if row[2] in _IN_A_LANE):
            raise LockAgain
        ids = [row[0] for row in actions]
        cursor = await conn.execute(outbox.queries["erase_actions"], {"ids": ids})
        deleted = await cursor.fetchall()
        # The lanes whose live actions were deleted (each taken above) are looked at again,
        # so that the actions behind a deleted head do not wait.
        lanes = sorted({row[2] for row in deleted if row[3] in _IN_A_LANE})
        if lanes:
            await conn.execute(outbox.queries["lower_lanes_wait"], {"lanes": lanes})
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
    event("erasure.done", actions=len(deleted), catalogs=",".join(sorted(erased)))
    return ErasureReport(actions=len(deleted), catalogs=erased)
