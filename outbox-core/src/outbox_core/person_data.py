"""The contract of a package's person data: what erasure reaches in every package.

A low module of its own, so that the plugin host (which validates what plugins register) and
erasure (which runs the catalogs) both import it, and neither imports the other.
"""

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
