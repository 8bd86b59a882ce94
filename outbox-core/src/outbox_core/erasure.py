"""Erasure of a person: their actions, and every package's person data, in one transaction."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from psycopg import AsyncConnection


@runtime_checkable
class PersonDataCatalog(Protocol):
    """What a package erases for a subject. Registered with ``outbox_register_person_data``."""

    name: str

    async def erase(self, conn: AsyncConnection[Any], subject_account_id: str) -> int:
        """Delete the subject's rows in ``conn``'s transaction; return how many."""
        ...


