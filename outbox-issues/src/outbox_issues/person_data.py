"""The person data of outbox-issues: the reports of an erased reporter.

In the erasure's own transaction, for each report of the erased account: the report's actions
that have not started are cancelled (their ``ended`` hooks run, so the filing says STOPPED
when its FILE_ISSUE never wrote); ``CLEANUP_ISSUE`` is enqueued in the report's lane whenever
the filing has a write in flight or done (it runs after an in-flight FILE_ISSUE ends, and finds
that issue by its marker); the filing says what is still published and where
(``still_published``, which the cleanup narrows); and the report (title, text, reporter) and
the draft's answer are deleted. None of the issue kinds addresses the reporter
(``subject_account_id`` is empty), so the core's erasure never deletes one whose write is in
flight.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from outbox_core import ActionRequest, StopReason, erasing_outbox

from . import markers
from .adapter import CLEANUP_ISSUE
from .domain import FilingState, cleanup_key, file_key, lane, queries

ERASED = StopReason.CANCELLED


def still_published(report_id: str, repository: str | None, issue_url: str | None) -> str:
    """What of an erased reporter's may be published on the tracker until ``CLEANUP_ISSUE``
    removes it, and where, in words an operator can act on by hand: the issue (its URL, or
    its repository and the marker its body carries when the filing never learned its number),
    its title and body, its edit history, and this package's comments that quote the text."""
    if issue_url is not None:
        where = issue_url
    else:
        marker = markers.action_marker(file_key(report_id, 1))
        where = f"the issue in {repository or 'the filing repository'} whose body holds {marker}"
    return (
        f"the reporter's title and text in {where} (its title, its body and earlier versions "
        f"in its edit history), and the comments on it holding {markers.quote_marker(report_id)}"
    )


class IssuesPersonData:
    """Registered with ``outbox_register_person_data``."""

    name = "issues"

    async def erase(self, conn: AsyncConnection[Any], subject_account_id: str) -> int:
        outbox = erasing_outbox()
        named = queries(outbox.schema)
        cursor = await conn.execute(named["reports_of_subject"], {"subject": subject_account_id})
        reports = [row[0] for row in await cursor.fetchall()]
        for report_id in reports:
            # Cancel first, then take the filing: a cancel waits for the report's lane, and an
            # ending that holds the lane may be waiting for the filing (its ended hook).
            cursor = await conn.execute(named["lane_unstarted"], {"lane": lane(report_id)})
            for (action_id,) in await cursor.fetchall():
                await outbox.acancel(conn, action_id, ERASED)
            # Under the filing's lock, a FILE_ISSUE attempt has either said that it writes
            # (FILING, last_write_at) or will find the report gone and write nothing.
            cursor = await conn.execute(named["lock_filing"], {"report": report_id})
            filing = await cursor.fetchone()
            cursor = await conn.execute(named["lane_written"], {"lane": lane(report_id)})
            row = await cursor.fetchone()
            written = bool(row and row[0])
            if filing is not None:
                state, workspace, last_write_at = FilingState(filing[0]), filing[2], filing[6]
                written = (
                    written
                    or last_write_at is not None
                    or state
                    in (
                        FilingState.FILING,
                        FilingState.FILED,
                    )
                )
                published = None
                if written:
                    published = still_published(report_id, filing[8], filing[9])
                    await outbox.aenqueue(
                        conn,
                        ActionRequest(
                            kind=CLEANUP_ISSUE,
                            lane_key=lane(report_id),
                            idempotency_key=cleanup_key(report_id),
                            payload={"report": report_id},
                            workspace_id=workspace,
                        ),
                    )
                await conn.execute(
                    named["erase_filing_text"], {"report": report_id, "published": published}
                )
            await conn.execute(named["erase_report"], {"report": report_id})
        return len(reports)
