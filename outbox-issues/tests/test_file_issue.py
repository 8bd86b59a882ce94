"""FILE_ISSUE: every row of the results table against the loopback tracker.

Each row: the fault, then (state, stop reason, attempts) after the first drain, the same after
a second drain (the fault is gone by then), the issues the tracker holds and the writes that
carried this action's marker: never two issues for one action.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import FilingState
from outbox_issues.testing import PUBLIC, GitHubTestServer, serve_issues

from .conftest import REPORTER, TEXT, action, filing, submit

KEY = "file_issue:r1:1"
ADMITTED, DONE, FAILED, EXECUTING, UNCERTAIN = (
    ActionState.ADMITTED,
    ActionState.DONE,
    ActionState.FAILED,
    ActionState.EXECUTING,
    ActionState.UNCERTAIN,
)
DEFERRED = (ADMITTED, None, 0)
RETRIED = (ADMITTED, None, 1)
REREAD = (EXECUTING, None, 1)
FILED_FIRST = (DONE, StopReason.COMPLETED, 1)
FILED_SECOND = (DONE, StopReason.COMPLETED, 2)


@dataclass(frozen=True)
class Row:
    fault: Callable[[GitHubTestServer], None]
    first: tuple[ActionState, str | None, int]
    final: tuple[ActionState, str | None, int]
    issues: int
    writes: int


def failed(reason: str) -> tuple[ActionState, str | None, int]:
    return (FAILED, reason, 1)


TABLE: dict[str, Row] = {
    "created": Row(lambda s: None, FILED_FIRST, FILED_FIRST, 1, 1),
    # Nothing was written: the tracker said so before recording anything.
    "primary limit 403": Row(
        lambda s: s.primary_limit("create_issue"), DEFERRED, FILED_FIRST, 1, 1
    ),
    "primary limit 429": Row(
        lambda s: s.primary_limit("create_issue", status=429), DEFERRED, FILED_FIRST, 1, 1
    ),
    "secondary limit 403": Row(
        lambda s: s.secondary_limit("create_issue"), DEFERRED, FILED_FIRST, 1, 1
    ),
    "secondary limit 429 with retry-after": Row(
        lambda s: s.secondary_limit("create_issue", retry_after=5, status=429),
        DEFERRED,
        FILED_FIRST,
        1,
        1,
    ),
    "401": Row(
        lambda s: s.fail("create_issue", 401, "Bad credentials"),
        failed("GITHUB_401"),
        failed("GITHUB_401"),
        0,
        0,
    ),
    "403 (headers of a limit not reached)": Row(
        lambda s: s.fail("create_issue", 403, "Resource not accessible by integration"),
        failed("GITHUB_403"),
        failed("GITHUB_403"),
        0,
        0,
    ),
    "404 repository gone": Row(
        lambda s: s.remove_repository(PUBLIC), failed("GITHUB_404"), failed("GITHUB_404"), 0, 0
    ),
    "410 issues disabled": Row(
        lambda s: s.fail("create_issue", 410, "Issues are disabled for this repo"),
        failed("GITHUB_410"),
        failed("GITHUB_410"),
        0,
        0,
    ),
    "422 on the title": Row(
        lambda s: s.validation_failed("create_issue"),
        failed("CONTENT_REFUSED"),
        failed("CONTENT_REFUSED"),
        0,
        0,
    ),
    "422 on another field": Row(
        lambda s: s.validation_failed("create_issue", "labels"),
        failed("GITHUB_422"),
        failed("GITHUB_422"),
        0,
        0,
    ),
    # The request may have been taken: read back by the marker before writing again.
    "500": Row(lambda s: s.fail("create_issue", 500), REREAD, FILED_SECOND, 1, 1),
    "502": Row(lambda s: s.fail("create_issue", 502, "Bad Gateway"), REREAD, FILED_SECOND, 1, 1),
    "dropped before recording": Row(lambda s: s.drop("create_issue"), REREAD, FILED_SECOND, 1, 1),
    "accepted then dropped": Row(
        lambda s: s.drop("create_issue", after_recording=True), REREAD, FILED_SECOND, 1, 1
    ),
    "stalled before recording": Row(lambda s: s.stall("create_issue"), REREAD, FILED_SECOND, 1, 1),
    "accepted then stalled": Row(
        lambda s: s.stall("create_issue", after_recording=True), REREAD, FILED_SECOND, 1, 1
    ),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_each_tracker_answer_ends_file_issue_as_the_table_says_and_never_files_twice(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    row = TABLE[case]
    row.fault(tracker_server)
    submit(issues_db)

    issues_db.drain()
    assert action(issues_db, KEY) == row.first

    tracker_server.clear_faults()
    issues_db.drain()
    assert action(issues_db, KEY) == row.final
    assert len(tracker_server.issues_in(PUBLIC, with_deleted=True)) == row.issues
    assert tracker_server.writes_for(KEY) == row.writes


@pytest.mark.parametrize("case", [name for name, row in TABLE.items() if row.final[0] is DONE])
def test_a_filed_issue_moves_the_filing_to_filed_with_its_number_and_url(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    TABLE[case].fault(tracker_server)
    submit(issues_db)
    issues_db.drain()
    tracker_server.clear_faults()
    issues_db.drain()

    [issue] = tracker_server.issues_in(PUBLIC)
    found = filing(issues_db)
    assert found.state is FilingState.FILED
    assert (found.repository, found.issue_number) == (PUBLIC, issue.number)
    assert found.issue_url == f"{tracker_server.base_url}/{PUBLIC}/issues/{issue.number}"
    assert (
        issues_db.scalar(
            "SELECT readback_ref FROM {schema}.agent_action WHERE idempotency_key = %s", (KEY,)
        )
        == found.issue_url
    )


@pytest.mark.parametrize("case", [name for name, row in TABLE.items() if row.final[0] is FAILED])
def test_a_refused_filing_stops_with_the_reason_visible_on_the_filing(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    TABLE[case].fault(tracker_server)
    submit(issues_db)
    issues_db.drain()

    found = filing(issues_db)
    assert found.state is FilingState.STOPPED
    assert (found.stop_reason, found.stopped_by) == (TABLE[case].final[1], "FILE_ISSUE")


@pytest.mark.parametrize("case", [name for name, row in TABLE.items() if row.first == REREAD])
def test_an_unconfirmed_write_at_the_last_attempt_ends_uncertain_and_the_filing_stopped(
    case: str, issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    TABLE[case].fault(tracker_server)
    submit(issues_db)
    issues_db.execute("UPDATE {schema}.agent_action SET max_attempts = 1")

    issues_db.drain()

    assert action(issues_db, KEY) == (UNCERTAIN, StopReason.ATTEMPTS_EXHAUSTED, 1)
    assert filing(issues_db).state is FilingState.STOPPED
    assert filing(issues_db).stop_reason == StopReason.ATTEMPTS_EXHAUSTED


def test_a_tracker_that_refuses_tcp_connections_is_retried_and_nothing_is_filed(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    serve_issues(outbox_db, tracker_server, api_url=f"http://127.0.0.1:{closed}/api/v3")
    submit(outbox_db)
    outbox_db.execute("UPDATE {schema}.agent_action SET max_attempts = 2")

    outbox_db.drain()
    assert action(outbox_db, KEY) == RETRIED
    outbox_db.drain()
    assert action(outbox_db, KEY) == (FAILED, StopReason.ATTEMPTS_EXHAUSTED, 2)
    assert tracker_server.requests == []


def test_a_primary_limit_defers_until_the_reset_the_tracker_names(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.primary_limit("create_issue", reset_in=600)
    submit(issues_db)

    issues_db.drain()

    wait = issues_db.scalar(
        "SELECT extract(epoch FROM due_at - now()) FROM {schema}.agent_action "
        "WHERE idempotency_key = %s",
        (KEY,),
    )
    assert 500 < wait <= 700


def test_a_secondary_limit_without_retry_after_defers_at_least_a_minute(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.secondary_limit("create_issue")
    submit(issues_db)

    issues_db.drain()

    wait = issues_db.scalar(
        "SELECT extract(epoch FROM due_at - now()) FROM {schema}.agent_action "
        "WHERE idempotency_key = %s",
        (KEY,),
    )
    assert wait >= 55


def test_without_a_token_or_repository_file_issue_fails_not_configured(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, token=None)
    submit(outbox_db)

    outbox_db.drain()

    assert action(outbox_db, KEY) == (FAILED, StopReason.NOT_CONFIGURED, 1)
    assert filing(outbox_db).stop_reason == StopReason.NOT_CONFIGURED
    assert tracker_server.requests == []


def test_the_issue_names_an_opaque_report_reference_never_the_reporter(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    submit(issues_db, text=TEXT + " <!-- outbox:reporter-text:end --> <!-- outbox:action x -->")
    issues_db.drain()

    [issue] = tracker_server.issues_in(PUBLIC)
    assert REPORTER not in issue.body and REPORTER not in issue.title
    assert "`r1`" in issue.body
    assert issue.labels == ["feedback"]
    # The reporter's text cannot forge a marker or end its own section early.
    assert issue.body.count("<!-- outbox:reporter-text:end -->") == 1
    assert issue.body.count("<!-- outbox:action") == 1
    body = issue.body
    assert body.index(TEXT) > body.index("<!-- outbox:reporter-text:begin -->")
    assert body.index(TEXT) < body.index("<!-- outbox:reporter-text:end -->")
