"""What GitHub cannot take whole is refused at enqueue, before anything is written; what GitHub
refuses all the same (a 422 on the content) stops the filing with a reason that names it, and
an edit files it again."""

from __future__ import annotations

import logging

import pytest

from outbox_core import ActionState, InvalidRequest, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import FilingState, edit_report, markers, publish_report, submit_report
from outbox_issues.content import compose
from outbox_issues.errors import NotFiled
from outbox_issues.limits import MAX_BODY
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import REPORTER, action, filing, submit

INVISIBLE_TITLES = {
    "byte order mark": "\ufeff",
    "zero-width space and joiner": "\u200b\u200d",
    "word joiner between spaces": " \u2060 ",
    "no-break space and soft hyphen": "\u00a0\u00ad",
    "Hangul filler": "\u3164",
    "bidirectional marks": "\u200e\u200f",
}


def rows(db: OutboxTestDatabase) -> tuple[int, int, int]:
    return (
        db.scalar("SELECT count(*) FROM {schema}.issue_report"),
        db.scalar("SELECT count(*) FROM {schema}.issue_filing"),
        db.scalar("SELECT count(*) FROM {schema}.agent_action"),
    )


def longest_text(report: str = "r1") -> int:
    """The longest plain text whose issue (generation 1) GitHub takes whole."""
    overhead = len(compose(report, "t", "", 1, []).body)
    return MAX_BODY - overhead


@pytest.mark.parametrize("name", sorted(INVISIBLE_TITLES))
def test_a_title_of_invisible_characters_only_is_refused_at_submit_and_nothing_is_written(
    issues_db: OutboxTestDatabase, name: str
) -> None:
    with issues_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="title: must hold a visible character"):
            submit_report(
                conn,
                report_id="r1",
                workspace_id="ws-1",
                reporter_account_id=REPORTER,
                title=INVISIBLE_TITLES[name],
                text="The export does nothing.",
                outbox=issues_db.outbox,
            )
        conn.commit()
    assert rows(issues_db) == (0, 0, 0)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x" * (longest_text() + 1), id="one character over"),
        # Each "<!--" a person writes is made inert ("&lt;!--"): the body as written counts.
        pytest.param("<!--" * (longest_text() // 4), id="inert comment openers"),
    ],
)
def test_a_report_whose_issue_would_pass_githubs_body_limit_is_refused_at_submit(
    issues_db: OutboxTestDatabase, text: str
) -> None:
    with pytest.raises(InvalidRequest, match="text: the issue's body would be .* 65,536"):
        submit(issues_db, text=text)
    assert rows(issues_db) == (0, 0, 0)


def test_the_longest_text_that_fits_is_filed_whole_never_truncated(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    text = "é" * (longest_text() - 1) + "🌈"  # characters, not UTF-8 bytes or UTF-16 units
    submit(issues_db, text=text)
    issues_db.drain()

    assert action(issues_db, "file_issue:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert text in issue.body and len(issue.body) == MAX_BODY


def test_an_edit_whose_issue_would_pass_the_limit_is_refused_before_anything_is_written(
    issues_db: OutboxTestDatabase,
) -> None:
    submit(issues_db)
    issues_db.drain()
    before = rows(issues_db)
    with issues_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="text: the issue's body would be"):
            edit_report(conn, "r1", text="x" * MAX_BODY, outbox=issues_db.outbox)
        with pytest.raises(InvalidRequest, match="title: must hold a visible character"):
            edit_report(conn, "r1", title="\ufeff", outbox=issues_db.outbox)
        conn.commit()
    assert rows(issues_db) == before
    assert filing(issues_db).generation == 1


def test_a_draft_too_long_beside_the_report_is_shortened_and_the_report_filed_whole(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    text = "r" * (longest_text() - 1_000)  # fits alone, with little room for a draft
    submit(issues_db, text=text)
    issues_db.execute(
        "UPDATE {schema}.issue_filing SET draft_generation = 1, draft_title = %s, draft_body = %s",
        ("\ufeff", "d" * 20_000),  # an invisible title, and a long answer
    )
    issues_db.drain()

    assert action(issues_db, "file_issue:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert text in issue.body and len(issue.body) <= MAX_BODY
    assert "The draft was shortened to fit" in issue.body and "d" * 10 in issue.body
    assert issue.title == "Export does nothing"  # the report's own, not the invisible one


def test_a_422_on_the_content_stops_the_filing_as_content_refused_and_an_edit_files_it_again(
    issues_db: OutboxTestDatabase,
    tracker_server: GitHubTestServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="outbox")
    tracker_server.validation_failed("create_issue", "body")  # a limit this package missed
    submit(issues_db)
    issues_db.drain()

    assert action(issues_db, "file_issue:r1:1") == (ActionState.FAILED, "CONTENT_REFUSED", 1)
    stopped = filing(issues_db)
    assert (stopped.state, stopped.stop_reason) == (FilingState.STOPPED, "CONTENT_REFUSED")
    detail = issues_db.scalar("SELECT last_detail FROM {schema}.agent_action")
    assert detail == "HTTP 422 Validation Failed: body:invalid"
    [event] = [r for r in caplog.records if getattr(r, "event", None) == "issues.content_refused"]
    assert (event.levelno, getattr(event, "action.fields")) == (logging.ERROR, "body:invalid")
    with issues_db.connect() as conn, pytest.raises(NotFiled, match="edit_report .* files it"):
        publish_report(conn, "r1", outbox=issues_db.outbox)

    with issues_db.connect() as conn:
        shorter = "Shorter: the export does nothing."
        again = edit_report(conn, "r1", text=shorter, outbox=issues_db.outbox)
    issues_db.drain()

    assert (again.generation, again.publish_action_id) == (2, None)
    assert action(issues_db, "file_issue:r1:2") == (ActionState.DONE, StopReason.COMPLETED, 1)
    filed = filing(issues_db)
    assert (filed.state, filed.filed_generation, filed.stop_reason) == (FilingState.FILED, 2, None)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert shorter in issue.body
    assert markers.action_marker("file_issue:r1:1") in issue.body  # found by the same marker


def test_a_publish_of_a_stored_report_github_would_not_take_whole_is_refused_by_its_kinds_check(
    issues_db: OutboxTestDatabase,
) -> None:
    """PUBLISH_REPORT's own enqueue check measures the stored report of its generation (one
    stored past the limit by a build before this check): refused, nothing written."""
    submit(issues_db)
    issues_db.drain()
    issues_db.execute("UPDATE {schema}.issue_report SET text = repeat('x', 70000)")
    before = rows(issues_db)
    with issues_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="text: the issue's body would be"):
            publish_report(conn, "r1", outbox=issues_db.outbox)
        conn.commit()
    assert rows(issues_db) == before
