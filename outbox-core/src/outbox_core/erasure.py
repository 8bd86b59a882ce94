"""Erasure of a person: their actions, and every package's person data, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from psycopg import AsyncConnection

from .errors import InvalidRequest
from .observability import event

if TYPE_CHECKING:
    from .outbox import Outbox


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
    conn: AsyncConnection[Any], subject_account_id: str, *, outbox: Outbox | None = None
) -> ErasureReport:
    """Delete every action addressed to the subject and erase every package's person data,
    in ``conn``'s current transaction (the caller commits).

    A pending action is then never carried out: its row is gone, so no claim finds it and
    its fence refuses. A write that already passed its fence still reaches the provider, as it
    would have a moment earlier. The lanes of deleted actions are looked at again so that the
    actions behind a deleted head do not wait.
    """
    from .outbox import default_outbox

    outbox = outbox if outbox is not None else default_outbox()
    if not isinstance(subject_account_id, str) or not subject_account_id:
        raise InvalidRequest("subject_account_id", "name the account to erase")
    # The lanes first, then the actions: the order of a claim and a settle (see the query).
    await conn.execute(outbox.queries["lock_subject_lanes"], {"subject": subject_account_id})
    cursor = await conn.execute(outbox.queries["erase_subject"], {"subject": subject_account_id})
    deleted = await cursor.fetchall()
    lanes = sorted({row[2] for row in deleted})
    if lanes:
        await conn.execute(outbox.queries["lower_lanes_wait"], {"lanes": lanes})
    erased: dict[str, int] = {}
    for catalog in outbox.host.person_data:
        erased[catalog.name] = await catalog.erase(conn, subject_account_id)
    event("erasure.done", actions=len(deleted), catalogs=",".join(sorted(erased)))
    return ErasureReport(actions=len(deleted), catalogs=erased)
