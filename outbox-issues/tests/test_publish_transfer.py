"""PUBLISH_REPORT (/publish) and TRANSFER_ISSUE (Make private) against the loopback tracker."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import FilingState, edit_report, make_private, publish_report
from outbox_issues.testing import PRIVATE, PUBLIC, GitHubTestServer, StoredIssue

from .conftest import action, filing, submit

DONE1 = (ActionState.DONE, StopReason.COMPLETED, 1)
DONE2 = (ActionState.DONE, StopReason.COMPLETED, 2)
REREAD = (ActionState.EXECUTING, None, 1)
DEFERRED = (ActionState.ADMITTED, None, 0)


def filed(db: OutboxTestDatabase) -> None:
    submit(db)
    db.drain()
    assert filing(db).state is FilingState.FILED


def moved_by_hand(db: OutboxTestDatabase, server: GitHubTestServer) -> StoredIssue:
    """The filed issue, moved to the private repository by a person in GitHub's UI."""
    filed(db)
    [issue] = server.issues_in(PUBLIC)
    return server.move_issue(PUBLIC, issue.number, PRIVATE)


def edit(db: OutboxTestDatabase, text: str = "It also fails for one row.") -> None:
    with db.connect() as conn:
        edit_report(conn, "r1", text=text, outbox=db.outbox)


PUBLISH: dict[
    str, tuple[Callable[[GitHubTestServer], None], tuple[object, ...], tuple[object, ...], int]
] = {
    "edited": (lambda s: None, DONE1, DONE1, 1),
    "accepted then dropped": (
        lambda s: s.drop("update_issue", after_recording=True),
        REREAD,
        DONE2,
        1,
    ),
    "dropped before recording": (lambda s: s.drop("update_issue"), REREAD, DONE2, 1),
    "500": (lambda s: s.fail("update_issue", 500), REREAD, DONE2, 1),
    "secondary limit": (lambda s: s.secondary_limit("update_issue"), DEFERRED, DONE1, 1),
    "422 on the body": (
        lambda s: s.validation_failed("update_issue", "body"),
        (ActionState.FAILED, "CONTENT_REFUSED", 1),
        (ActionState.FAILED, "CONTENT_REFUSED", 1),
        0,
    ),
    "issue read fails 404": (
        lambda s: s.fail("get_issue", 404, "Not Found"),
        (ActionState.FAILED, "GITHUB_404", 1),
        (ActionState.FAILED, "GITHUB_404", 1),
        0,
    ),
}


@pytest.mark.parametrize("case", list(PUBLISH))
def test_each_answer_to_a_publish_ends_as_the_table_says_and_edits_at_most_once(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    fault, first, final, edits = PUBLISH[case]
    filed(issues_db)
    fault(tracker_server)
    edit(issues_db)

    issues_db.drain()
    assert action(issues_db, "publish:r1:2") == first
    tracker_server.clear_faults()
    issues_db.drain()

    assert action(issues_db, "publish:r1:2") == final
    assert tracker_server.writes_for("publish:r1:2") == edits
    [issue] = tracker_server.issues_in(PUBLIC)
    if final in (DONE1, DONE2):
        assert "It also fails for one row." in issue.body
        assert "<!-- outbox:content r1 2 " in issue.body
        assert filing(issues_db).published_generation == 2
    else:
        assert filing(issues_db).state is FilingState.FILED  # the issue stays filed
        assert filing(issues_db).last_error is not None


def test_a_publish_of_the_generation_the_issue_shows_writes_nothing(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    filed(issues_db)
    edit(issues_db)
    issues_db.drain()
    # The same generation published again, under a fresh key (as after retention).
    issues_db.execute("DELETE FROM {schema}.agent_action WHERE idempotency_key = 'publish:r1:2'")
    with issues_db.connect() as conn:
        publish_report(conn, "r1", outbox=issues_db.outbox)
    issues_db.drain()

    assert action(issues_db, "publish:r1:2") == DONE1
    assert tracker_server.writes_for("publish:r1:2") == 1


TRANSFER: dict[
    str, tuple[Callable[[GitHubTestServer], None], tuple[object, ...], tuple[object, ...], int]
] = {
    "moved": (lambda s: None, DONE1, DONE1, 1),
    "accepted then dropped": (
        lambda s: s.drop("graphql:transferIssue", after_recording=True),
        REREAD,
        DONE2,
        1,
    ),
    "dropped before recording": (lambda s: s.drop("graphql:transferIssue"), REREAD, DONE2, 1),
    "GraphQL RATE_LIMITED at HTTP 200": (
        lambda s: s.graphql_error("graphql:transferIssue", "RATE_LIMITED"),
        DEFERRED,
        DONE1,
        1,
    ),
    "GraphQL FORBIDDEN at HTTP 200": (
        lambda s: s.graphql_error("graphql:transferIssue", "FORBIDDEN"),
        (ActionState.FAILED, "GRAPHQL_FORBIDDEN", 1),
        (ActionState.FAILED, "GRAPHQL_FORBIDDEN", 1),
        0,
    ),
    "GraphQL NOT_FOUND at HTTP 200": (
        lambda s: s.graphql_error("graphql:repository", "NOT_FOUND"),
        (ActionState.FAILED, "GRAPHQL_NOT_FOUND", 1),
        (ActionState.FAILED, "GRAPHQL_NOT_FOUND", 1),
        0,
    ),
    "GraphQL 502": (
        lambda s: s.fail("graphql:transferIssue", 502, "Bad Gateway"),
        REREAD,
        DONE2,
        1,
    ),
    "secondary limit 403": (
        lambda s: s.secondary_limit("graphql:transferIssue"),
        DEFERRED,
        DONE1,
        1,
    ),
}


@pytest.mark.parametrize("case", list(TRANSFER))
def test_each_answer_to_make_private_ends_as_the_table_says_and_transfers_at_most_once(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    fault, first, final, transfers = TRANSFER[case]
    filed(issues_db)
    fault(tracker_server)
    with issues_db.connect() as conn:
        make_private(conn, "r1", outbox=issues_db.outbox)

    issues_db.drain()
    assert action(issues_db, "transfer:r1") == first
    tracker_server.clear_faults()
    issues_db.drain()

    assert action(issues_db, "transfer:r1") == final
    assert tracker_server.writes_of("graphql:transferIssue") == transfers
    found = filing(issues_db)
    if transfers:
        [issue] = tracker_server.issues_in(PRIVATE)
        assert tracker_server.issues_in(PUBLIC) == []
        assert (found.repository, found.issue_number, found.private) == (
            PRIVATE,
            issue.number,
            True,
        )
        assert found.issue_url == f"{tracker_server.base_url}/{PRIVATE}/issues/{issue.number}"
    else:
        assert (found.repository, found.private) == (PUBLIC, False)
        assert found.last_error is not None


def test_after_make_private_a_publish_edits_the_issue_where_it_is_now(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    filed(issues_db)
    with issues_db.connect() as conn:
        make_private(conn, "r1", outbox=issues_db.outbox)
    edit(issues_db, "Now in private.")
    issues_db.drain()

    [issue] = tracker_server.issues_in(PRIVATE)
    assert "Now in private." in issue.body
    assert action(issues_db, "publish:r1:2") == DONE1


def test_an_issue_someone_already_moved_to_the_private_repository_is_done_without_a_transfer(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    moved_by_hand(issues_db, tracker_server)
    with issues_db.connect() as conn:
        make_private(conn, "r1", outbox=issues_db.outbox)

    issues_db.drain()

    assert action(issues_db, "transfer:r1") == DONE1
    assert tracker_server.writes_of("graphql:transferIssue") == 0
    assert (filing(issues_db).repository, filing(issues_db).private) == (PRIVATE, True)


def test_a_transfer_refused_as_already_there_is_read_again_and_done(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    filed(issues_db)
    tracker_server.graphql_error(
        "graphql:transferIssue", "UNPROCESSABLE", "The issue is already in this repository."
    )
    # The refusal comes while the issue did move (a stale read before it): moved meanwhile.
    [issue] = tracker_server.issues_in(PUBLIC)
    with issues_db.connect() as conn:
        make_private(conn, "r1", outbox=issues_db.outbox)
    original = tracker_server.take_fault

    def move_then_refuse(op: str):  # type: ignore[no-untyped-def]
        fault = original(op)
        if op == "graphql:transferIssue" and fault is not None:
            tracker_server.move_issue(PUBLIC, issue.number, PRIVATE)
        return fault

    tracker_server.take_fault = move_then_refuse  # type: ignore[method-assign]
    issues_db.drain()

    assert action(issues_db, "transfer:r1") == DONE1
    assert filing(issues_db).repository == PRIVATE


def test_a_publish_of_an_issue_a_person_moved_edits_it_where_it_is_and_the_filing_follows(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    issue = moved_by_hand(issues_db, tracker_server)
    edit(issues_db, "Edited after the move.")

    issues_db.drain()

    assert action(issues_db, "publish:r1:2") == DONE1
    assert "Edited after the move." in issue.body
    found = filing(issues_db)
    assert (found.repository, found.issue_number) == (PRIVATE, 1)
