"""The person data of outbox-feedback: the feedback on the work of an erased author.

Every send is addressed to the author of the reviewed work (``subject_account_id``), so the
core's erasure deletes the feedback's pending sends in the same transaction; this catalog
deletes the feedback itself, its items and its copy rows. A send whose write already passed
its fence still lands, as it would have a moment earlier (its next transaction under the lease
finds the action gone and commits nothing).
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from outbox_core import erasing_outbox

from .domain import queries


class FeedbackPersonData:
    """Registered with ``outbox_register_person_data``."""

    name = "feedback"

    async def erase(self, conn: AsyncConnection[Any], subject_account_id: str) -> int:
        named = queries(erasing_outbox().schema)
        cursor = await conn.execute(named["feedback_of_subject"], {"subject": subject_account_id})
        erased = [row[0] for row in await cursor.fetchall()]
        for feedback_id in erased:
            await conn.execute(named["erase_feedback"], {"feedback": feedback_id})
        return len(erased)
