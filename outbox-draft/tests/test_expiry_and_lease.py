"""The draft's expiry (every time is the database's: the test backdates expires_at) and its
lease: an answer is never kept by an attempt whose lease another claim took over."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from outbox_core import ActionState, StopReason, erase_subject
from outbox_core.testing import OutboxTestDatabase
from outbox_draft.testing import ModelTestServer, Recorded
from outbox_issues import FilingState
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import (
    REPORTER,
    TEXT,
    TITLE,
    action,
    enqueue_draft,
    filing,
    filing_states,
    kept,
    log_filing_states,
    store_report,
    submit,
)


def test_a_draft_that_could_not_start_within_ten_minutes_expires_and_the_filing_goes_on(
    filing_db: OutboxTestDatabase, model_server: ModelTestServer, tracker_server: GitHubTestServer
) -> None:
    submit(filing_db)
    filing_db.execute(
        "UPDATE {schema}.agent_action SET expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = 'draft:r1:1' AND state = 'ADMITTED'"
    )

    filing_db.drain()

    assert action(filing_db, "draft:r1:1") == (ActionState.CANCELLED, StopReason.EXPIRED, 0)
    assert model_server.requests == []
    assert kept(filing_db) == (None, None, None)  # ANSWERED without an answer
    # The FILE_ISSUE behind it in the lane ran, with the report's own title and text.
    assert action(filing_db, "file_issue:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.title == TITLE and TEXT in issue.body
    assert filing(filing_db).state is FilingState.FILED


def test_an_expired_draft_leaves_the_filing_answered_without_an_answer(
    draft_db: OutboxTestDatabase,
) -> None:
    log_filing_states(draft_db)
    store_report(draft_db)
    enqueue_draft(draft_db)
    draft_db.execute(
        "UPDATE {schema}.agent_action SET expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = 'draft:r1:1'"
    )

    draft_db.drain()

    assert action(draft_db, "draft:r1:1")[:2] == (ActionState.CANCELLED, StopReason.EXPIRED)
    assert filing_states(draft_db) == ["ANSWERED"]
    assert not filing(draft_db).has_draft


def _take_the_lease_over(db: OutboxTestDatabase) -> Any:
    """What a second replica's claim does once the lease ran out: the epoch (and the attempt)
    rise by one, and its lease is an hour."""

    def take(_: Recorded) -> None:
        with psycopg.connect(db.url, autocommit=True) as conn, conn.transaction():
            table = f'"{db.schema}".agent_action'
            conn.execute(
                f"UPDATE {table} SET lease_until = now() - interval '1 second' "
                "WHERE idempotency_key = 'draft:r1:1'"
            )
            conn.execute(
                f"UPDATE {table} SET epoch = epoch + 1, attempt = attempt + 1, "
                "lease_until = now() + interval '1 hour' WHERE idempotency_key = 'draft:r1:1'"
            )

    return take


def test_an_attempt_whose_lease_was_taken_over_after_the_answer_keeps_nothing(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    store_report(draft_db)
    enqueue_draft(draft_db)
    # Between the model's answer and the keep, another claim takes the action.
    model_server.before_answer(_take_the_lease_over(draft_db))

    draft_db.drain()

    assert len(model_server.served) == 1
    assert kept(draft_db) == (None, None, None)
    assert not filing(draft_db).has_draft
    state, epoch = draft_db.rows(
        "SELECT state, epoch FROM {schema}.agent_action WHERE idempotency_key = 'draft:r1:1'"
    )[0]
    assert (state, epoch) == ("EXECUTING", 2)  # the other holder's; this attempt abandoned

    # The other holder is gone too: its lease runs out, and the next attempt keeps its answer.
    draft_db.execute(
        "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 second' "
        "WHERE idempotency_key = 'draft:r1:1'"
    )
    draft_db.drain()
    assert action(draft_db, "draft:r1:1")[:2] == (ActionState.DONE, StopReason.COMPLETED)
    assert kept(draft_db)[0] == 1


def test_an_answer_that_arrives_after_the_reporter_was_erased_is_not_kept(
    filing_db: OutboxTestDatabase, model_server: ModelTestServer, tracker_server: GitHubTestServer
) -> None:
    def erase(_: Recorded) -> None:
        async def run() -> None:
            async with await filing_db.aconnect() as conn:
                await erase_subject(conn, REPORTER, outbox=filing_db.outbox)
                await conn.commit()

        asyncio.run(run())

    submit(filing_db)
    model_server.before_answer(erase)

    filing_db.drain()

    assert action(filing_db, "draft:r1:1")[:2] == (ActionState.CANCELLED, "REPORT_ERASED")
    assert kept(filing_db) == (None, None, None)
    assert filing_db.scalar("SELECT count(*) FROM {schema}.issue_report") == 0
    assert tracker_server.issues_in(PUBLIC) == []  # the FILE_ISSUE behind it was cancelled
