"""An erasure of the reporter: CLEANUP_ISSUE scrubs (or deletes) the issue and no row of the
reporter's is left; an erasure while FILE_ISSUE's write is in flight scrubs that issue too."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.erasure import erase_subject
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import FilingState, markers
from outbox_issues.testing import PUBLIC, GitHubTestServer, serve_issues

from .conftest import REPORTER, TEXT, action, filing, submit

DONE = (ActionState.DONE, StopReason.COMPLETED, 1)


async def erase(db: OutboxTestDatabase, subject: str = REPORTER) -> None:
    conn = await db.aconnect()
    async with conn:
        await erase_subject(conn, subject, outbox=db.outbox)
        await conn.commit()


def nothing_of_the_reporter_left(db: OutboxTestDatabase) -> None:
    assert db.scalar("SELECT count(*) FROM {schema}.issue_report") == 0
    dumped = (
        db.scalar("SELECT string_agg(t::text, ' ') FROM (SELECT * FROM {schema}.issue_filing) t")
        or ""
    )
    actions = (
        db.scalar("SELECT string_agg(t::text, ' ') FROM (SELECT * FROM {schema}.agent_action) t")
        or ""
    )
    for text in (REPORTER, "ada@example.com", "Export does nothing"):
        assert text not in dumped and text not in actions


async def test_the_whole_path_files_publishes_makes_private_and_an_erasure_scrubs_the_issue(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    from outbox_issues import aedit_report, amake_private

    submit(issues_db)
    await issues_db.adrain()
    assert filing(issues_db).state is FilingState.FILED
    conn = await issues_db.aconnect()
    async with conn:
        await aedit_report(conn, "r1", text=TEXT + " Still broken.", outbox=issues_db.outbox)
        await amake_private(conn, "r1", outbox=issues_db.outbox)
        await conn.commit()
    await issues_db.adrain()
    found = filing(issues_db)
    assert (found.published_generation, found.private) == (2, True)
    [issue] = tracker_server.issues_in(found.repository or "")
    quote = tracker_server.add_comment(
        found.repository or "", issue.number, f"{markers.quote_marker('r1')}\n> {TEXT}"
    )
    other = tracker_server.add_comment(found.repository or "", issue.number, "A maintainer's reply")

    await erase(issues_db)
    await issues_db.adrain()

    assert action(issues_db, "cleanup:r1") == DONE
    assert TEXT not in issue.body and "ada@example.com" not in issue.body
    assert issue.title == "Feedback report r1"
    assert markers.SCRUBBED in issue.body
    assert [c.id for c in tracker_server.comments_on(found.repository or "", issue.number)] == [
        other
    ]
    assert quote not in tracker_server.comments
    after = filing(issues_db)
    assert after.erased and after.scrubbed and after.history_retains_text
    assert not after.issue_deleted
    assert after.still_published is not None and "edit history" in after.still_published
    # GitHub keeps the earlier bodies, readable by anyone who can read the issue.
    assert any(TEXT in body for body in issue.edits)
    nothing_of_the_reporter_left(issues_db)


async def test_with_delete_on_erasure_the_issue_is_deleted_and_no_history_is_left(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=0.0, delete_on_erasure=True)
    submit(outbox_db)
    await outbox_db.adrain()
    tracker_server.drop("graphql:deleteIssue", after_recording=True)

    await erase(outbox_db)
    await outbox_db.adrain()
    assert action(outbox_db, "cleanup:r1") == (ActionState.EXECUTING, None, 1)
    await outbox_db.adrain()

    assert action(outbox_db, "cleanup:r1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert tracker_server.issues_in(PUBLIC) == []
    assert tracker_server.writes_of("graphql:deleteIssue") == 1
    after = filing(outbox_db)
    assert after.issue_deleted and not after.history_retains_text
    assert (after.delete_refused, after.still_published) == (None, None)
    nothing_of_the_reporter_left(outbox_db)


async def test_an_erasure_before_the_filing_started_cancels_it_and_files_nothing(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    submit(issues_db)

    await erase(issues_db)
    await issues_db.adrain()

    assert action(issues_db, "file_issue:r1:1") == (
        ActionState.CANCELLED,
        StopReason.CANCELLED,
        0,
    )
    assert (
        issues_db.scalar(
            "SELECT count(*) FROM {schema}.agent_action WHERE idempotency_key = 'cleanup:r1'"
        )
        == 0
    )
    assert filing(issues_db).state is FilingState.STOPPED
    assert tracker_server.requests == []
    nothing_of_the_reporter_left(issues_db)


async def test_an_erasure_while_file_issue_writes_scrubs_the_issue_it_files(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.hold("create_issue")
    submit(issues_db)
    draining = asyncio.create_task(issues_db.adrain())
    assert await asyncio.to_thread(tracker_server.held.wait, 30)

    await erase(issues_db)  # the issue is recorded, its answer not yet sent
    tracker_server.release()
    await draining
    await issues_db.adrain()

    assert action(issues_db, "file_issue:r1:1") == DONE
    assert action(issues_db, "cleanup:r1") == DONE
    [issue] = tracker_server.issues_in(PUBLIC)
    assert TEXT not in issue.body and issue.title == "Feedback report r1"
    nothing_of_the_reporter_left(issues_db)


async def test_an_erasure_after_an_unknown_write_finds_the_issue_by_its_marker_and_scrubs_it(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue", after_recording=True)
    submit(issues_db)
    issues_db.execute("UPDATE {schema}.agent_action SET max_attempts = 1")
    await issues_db.adrain()
    assert action(issues_db, "file_issue:r1:1")[0] is ActionState.UNCERTAIN

    await erase(issues_db)
    await issues_db.adrain()

    assert action(issues_db, "cleanup:r1") == DONE
    [issue] = tracker_server.issues_in(PUBLIC)
    assert TEXT not in issue.body
    nothing_of_the_reporter_left(issues_db)


async def test_a_reread_file_issue_whose_report_was_erased_never_writes_it_again(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.drop("create_issue")  # never recorded: the listing proves it absent
    submit(issues_db)
    await issues_db.adrain()

    await erase(issues_db)
    await issues_db.adrain()

    assert action(issues_db, "file_issue:r1:1") == (
        ActionState.CANCELLED,
        StopReason.ABSENT,
        2,
    )
    assert action(issues_db, "cleanup:r1") == DONE
    assert tracker_server.issues_in(PUBLIC) == []
    assert tracker_server.writes_for("file_issue:r1:1") == 0


CLEANUP = {
    "scrubbed": (lambda s: None, DONE, DONE, 1),
    "accepted then dropped": (
        lambda s: s.drop("update_issue", after_recording=True),
        (ActionState.EXECUTING, None, 1),
        (ActionState.DONE, StopReason.COMPLETED, 2),
        1,
    ),
    "primary limit": (
        lambda s: s.primary_limit("update_issue"),
        (ActionState.ADMITTED, None, 0),
        DONE,
        1,
    ),
    "repository gone": (
        lambda s: s.remove_repository(PUBLIC),
        (ActionState.FAILED, "GITHUB_404", 1),
        (ActionState.FAILED, "GITHUB_404", 1),
        0,
    ),
    "comment deletion dropped": (
        lambda s: s.drop("delete_comment", after_recording=True),
        (ActionState.EXECUTING, None, 1),
        (ActionState.DONE, StopReason.COMPLETED, 2),
        1,
    ),
}


@pytest.mark.parametrize("case", list(CLEANUP))
async def test_each_answer_to_a_cleanup_ends_as_the_table_says_and_scrubs_once(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    fault, first, final, scrubs = CLEANUP[case]
    submit(issues_db)
    await issues_db.adrain()
    [issue] = tracker_server.issues_in(PUBLIC)
    tracker_server.add_comment(PUBLIC, issue.number, f"{markers.quote_marker('r1')}\n> {TEXT}")
    fault(tracker_server)

    await erase(issues_db)
    await issues_db.adrain()
    assert action(issues_db, "cleanup:r1") == first
    tracker_server.clear_faults()
    await issues_db.adrain()

    assert action(issues_db, "cleanup:r1") == final
    assert tracker_server.writes_for("cleanup:r1") == scrubs
    if final[0] is ActionState.DONE:
        assert TEXT not in issue.body
        assert tracker_server.comments_on(PUBLIC, issue.number) == []
    else:
        assert filing(issues_db).last_error is not None
    nothing_of_the_reporter_left(issues_db)


REFUSED_DELETES = {
    "forbidden": "GraphQL FORBIDDEN",  # a token without admin rights on the repository
    "missing": "GraphQL undefinedField",  # a GraphQL schema without deleteIssue
    "not_found": "HTTP 404 Not Found",  # no GraphQL endpoint at that URL
}


@pytest.mark.parametrize("how", sorted(REFUSED_DELETES))
async def test_a_delete_the_tracker_refuses_falls_back_to_the_scrub_and_the_filing_says_why(
    how: Literal["forbidden", "missing", "not_found"],
    outbox_db: OutboxTestDatabase,
    tracker_server: GitHubTestServer,
) -> None:
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=0.0, delete_on_erasure=True)
    submit(outbox_db)
    await outbox_db.adrain()
    [issue] = tracker_server.issues_in(PUBLIC)
    tracker_server.refuse_deletes(how)

    await erase(outbox_db)
    await outbox_db.adrain()

    assert action(outbox_db, "cleanup:r1") == DONE
    assert TEXT not in issue.body and issue.title == "Feedback report r1"
    assert tracker_server.issues_in(PUBLIC) == [issue]  # scrubbed, not deleted
    after = filing(outbox_db)
    assert after.scrubbed and after.history_retains_text and not after.issue_deleted
    assert after.delete_refused == f"deleteIssue refused: {REFUSED_DELETES[how]}"
    assert after.still_published is not None and "edit history" in after.still_published
    assert filing(outbox_db).issue_url in after.still_published
    nothing_of_the_reporter_left(outbox_db)


async def test_when_the_scrub_is_refused_too_the_cleanup_fails_and_the_filing_names_what_is_left(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, listing_lag_seconds=0.0, delete_on_erasure=True)
    submit(outbox_db)
    await outbox_db.adrain()
    [issue] = tracker_server.issues_in(PUBLIC)
    before = filing(outbox_db)
    tracker_server.refuse_deletes("forbidden")
    tracker_server.fail("update_issue", 403, "Resource not accessible by integration", times=20)

    await erase(outbox_db)
    erased = filing(outbox_db)  # before the cleanup ran: the erasure says what is published
    await outbox_db.adrain()

    assert action(outbox_db, "cleanup:r1") == (ActionState.FAILED, "GITHUB_403", 1)
    assert TEXT in issue.body  # still published: the filing must say where, and what
    after = filing(outbox_db)
    assert (after.repository, after.issue_number, after.issue_url) == (
        before.repository,
        before.issue_number,
        before.issue_url,
    )
    assert after.delete_refused == "deleteIssue refused: GraphQL FORBIDDEN"
    assert after.last_error == "CLEANUP_ISSUE FAILED: GITHUB_403"
    assert not after.scrubbed and not after.issue_deleted
    assert erased.still_published == after.still_published
    assert after.still_published is not None and before.issue_url in after.still_published
    assert markers.quote_marker("r1") in after.still_published
    nothing_of_the_reporter_left(outbox_db)
