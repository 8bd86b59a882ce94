"""submit_report, edit_report, publish_report and make_private: what they enqueue, in which
lane and order, and what they refuse before writing anything."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from outbox_core import ActionState, EnqueueCheck, InvalidRequest, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_issues import (
    FilingState,
    NotConfigured,
    NotFiled,
    UnknownReport,
    asubmit_report,
    edit_report,
    make_private,
    publish_report,
    submit_report,
)
from outbox_issues.testing import PUBLIC, GitHubTestServer, serve_issues

from . import draft_plugin
from .conftest import REPORTER, TEXT, action, filing, submit


def rows(db: OutboxTestDatabase) -> tuple[int, int, int]:
    return (
        db.scalar("SELECT count(*) FROM {schema}.issue_report"),
        db.scalar("SELECT count(*) FROM {schema}.issue_filing"),
        db.scalar("SELECT count(*) FROM {schema}.agent_action"),
    )


def test_submit_stores_the_report_and_enqueues_file_issue_in_the_reports_lane_with_ids_only(
    issues_db: OutboxTestDatabase,
) -> None:
    submitted = submit(issues_db)

    assert submitted.created and submitted.generation == 1 and submitted.draft_action_id is None
    [(kind, lane, key, payload, workspace, subject)] = issues_db.rows(
        "SELECT kind, lane_key, idempotency_key, payload, workspace_id, subject_account_id "
        "FROM {schema}.agent_action"
    )
    assert (kind, lane, key) == ("FILE_ISSUE", "file_issue:r1", "file_issue:r1:1")
    assert payload == {"report": "r1", "generation": 1}
    assert (workspace, subject) == ("ws-1", None)  # never addressed to the reporter
    assert filing(issues_db).state is FilingState.NEW


async def test_the_async_submit_is_the_same_as_the_sync_one(
    issues_db: OutboxTestDatabase,
) -> None:
    conn = await issues_db.aconnect()
    async with conn:
        submitted = await asubmit_report(
            conn,
            report_id="r1",
            workspace_id="ws-1",
            reporter_account_id=REPORTER,
            title="t",
            text=TEXT,
            outbox=issues_db.outbox,
        )
        await conn.commit()
    assert submitted.created and submitted.file_action_id is not None
    assert rows(issues_db) == (1, 1, 1)


def test_a_second_submit_of_the_same_report_changes_nothing(issues_db: OutboxTestDatabase) -> None:
    submit(issues_db)
    again = submit(issues_db, text="different")
    assert not again.created
    assert rows(issues_db) == (1, 1, 1)


def test_two_racing_submits_of_one_report_make_one_filing_and_one_issue(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    first = issues_db.connect()
    first_result = submit_report(
        first,
        report_id="r1",
        workspace_id="ws-1",
        reporter_account_id=REPORTER,
        title="t",
        text=TEXT,
        outbox=issues_db.outbox,
    )
    results: list[object] = []

    def second() -> None:
        with issues_db.connect() as conn:  # waits on the first's uncommitted insert
            results.append(
                submit_report(
                    conn,
                    report_id="r1",
                    workspace_id="ws-1",
                    reporter_account_id=REPORTER,
                    title="t",
                    text=TEXT,
                    outbox=issues_db.outbox,
                )
            )

    racer = threading.Thread(target=second)
    racer.start()
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    while issues_db.scalar(waiting) == 0:
        racer.join(0.01)
    first.commit()
    first.close()
    racer.join()

    assert first_result.created and [r.created for r in results] == [False]  # type: ignore[attr-defined]
    issues_db.drain()
    assert rows(issues_db) == (1, 1, 1)
    assert len(tracker_server.issues_in(PUBLIC)) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("report_id", "has a space"),
        ("report_id", "with:colon"),
        ("title", ""),
        ("title", "x" * 257),
        ("text", "  "),
        ("reporter_account_id", ""),
        ("workspace_id", ""),
    ],
)
def test_an_invalid_submit_is_refused_and_writes_nothing(
    issues_db: OutboxTestDatabase, field: str, value: str
) -> None:
    values = {
        "report_id": "r1",
        "workspace_id": "ws-1",
        "reporter_account_id": REPORTER,
        "title": "t",
        "text": TEXT,
    }
    values[field] = value
    with issues_db.connect() as conn:
        with pytest.raises(InvalidRequest, match=field):
            submit_report(conn, outbox=issues_db.outbox, **values)
        conn.commit()
    assert rows(issues_db) == (0, 0, 0)


def test_publish_edit_and_make_private_of_an_unfiled_report_are_refused_and_write_nothing(
    issues_db: OutboxTestDatabase,
) -> None:
    submit(issues_db)
    with issues_db.connect() as conn:
        with pytest.raises(NotFiled, match="is NEW: call it again once the filing is FILED"):
            publish_report(conn, "r1", outbox=issues_db.outbox)
        with pytest.raises(NotFiled):
            edit_report(conn, "r1", text="more", outbox=issues_db.outbox)
        with pytest.raises(NotFiled):
            make_private(conn, "r1", outbox=issues_db.outbox)
        with pytest.raises(UnknownReport, match="no report 'r9'"):
            publish_report(conn, "r9", outbox=issues_db.outbox)
        conn.commit()
    assert rows(issues_db) == (1, 1, 1)
    assert issues_db.scalar("SELECT generation FROM {schema}.issue_report") == 1


def test_make_private_without_a_private_repository_is_refused(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    serve_issues(outbox_db, tracker_server, private_repository=None, listing_lag_seconds=0.0)
    submit(outbox_db)
    outbox_db.drain()
    with (
        outbox_db.connect() as conn,
        pytest.raises(NotConfigured, match="OUTBOX_ISSUES_PRIVATE_REPOSITORY"),
    ):
        make_private(conn, "r1", outbox=outbox_db.outbox)


def test_a_stopped_filing_says_how_to_go_on(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    tracker_server.fail("create_issue", 403, "Resource not accessible by integration")
    submit(issues_db)
    issues_db.drain()
    with issues_db.connect() as conn, pytest.raises(NotFiled, match="submit the report again"):
        publish_report(conn, "r1", outbox=issues_db.outbox)


def test_with_a_draft_plugin_the_draft_runs_first_in_the_lane_and_the_issue_uses_its_answer(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    draft_plugin.serve(issues_db)
    draft_plugin.ENABLED = True

    submitted = submit(issues_db)

    assert submitted.draft_action_id is not None
    assert submitted.draft_action_id < submitted.file_action_id  # type: ignore[operator]
    lanes = issues_db.rows("SELECT DISTINCT lane_key FROM {schema}.agent_action")
    assert lanes == [("file_issue:r1",)]
    issues_db.drain()
    assert action(issues_db, "draft:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert action(issues_db, "file_issue:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.title == "Drafted title 1"
    assert "Drafted summary 1" in issue.body and TEXT in issue.body
    assert filing(issues_db).state is FilingState.FILED


def test_a_redraft_after_filed_enqueues_the_draft_and_a_publish_of_the_next_generation(
    issues_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> None:
    draft_plugin.serve(issues_db)
    draft_plugin.ENABLED = True
    submit(issues_db)
    issues_db.drain()

    with issues_db.connect() as conn:
        again = edit_report(conn, "r1", outbox=issues_db.outbox)
    assert again.generation == 2 and again.file_action_id is None
    keys = [
        row[0]
        for row in issues_db.rows(
            "SELECT idempotency_key FROM {schema}.agent_action WHERE state = 'ADMITTED' ORDER BY id"
        )
    ]
    assert keys == ["draft:r1:2", "publish:r1:2"]
    issues_db.drain()

    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.title == "Drafted title 2" and "generation 2" in issue.body
    assert draft_plugin.DraftAdapter.calls == [("r1", 1), ("r1", 2)]
    found = filing(issues_db)
    assert (found.state, found.published_generation) == (FilingState.FILED, 2)


def test_a_draft_hook_that_names_another_lane_is_refused_and_nothing_is_written(
    issues_db: OutboxTestDatabase,
) -> None:
    draft_plugin.serve(issues_db)
    draft_plugin.ENABLED = True
    draft_plugin.LANE = "somewhere-else"

    with issues_db.connect() as conn, pytest.raises(InvalidRequest, match="must run in lane"):
        submit_report(
            conn,
            report_id="r1",
            workspace_id="ws-1",
            reporter_account_id=REPORTER,
            title="t",
            text=TEXT,
            outbox=issues_db.outbox,
        )
    assert rows(issues_db) == (0, 0, 0)


def test_the_filing_state_table_is_enforced_when_an_application_writes_it_directly(
    issues_db: OutboxTestDatabase,
) -> None:
    submit(issues_db)
    with pytest.raises(psycopg.errors.CheckViolation, match="NEW -> FILED"):
        issues_db.execute("UPDATE {schema}.issue_filing SET state = 'FILED'")


async def test_the_drafting_states_move_as_outbox_draft_will_move_them(
    issues_db: OutboxTestDatabase,
) -> None:
    from outbox_issues import domain

    submit(issues_db)
    conn = await issues_db.aconnect()
    async with conn:
        assert await domain.draft_claimed(conn, "outbox", "r1")
        assert await domain.draft_deferred(conn, "outbox", "r1")
        assert filing(issues_db).state is FilingState.NEW  # not committed yet
        await conn.commit()
        assert filing(issues_db).state is FilingState.DRAFT_WAITING
        assert await domain.draft_claimed(conn, "outbox", "r1")
        assert not await domain.keep_answer(conn, "outbox", "r1", 2, title="t", body="b")
        assert await domain.keep_answer(conn, "outbox", "r1", 1, title="t", body="b")
        assert await domain.draft_ended(conn, "outbox", "r1")
        await conn.commit()
    found = filing(issues_db)
    assert (found.state, found.draft_generation, found.has_draft) == (
        FilingState.ANSWERED,
        1,
        True,
    )
    # A filing that is STOPPED allows none of them: the helpers say so instead of raising.
    issues_db.execute("UPDATE {schema}.issue_filing SET state = 'STOPPED'")
    conn = await issues_db.aconnect()
    async with conn:
        assert not await domain.draft_claimed(conn, "outbox", "r1")
        assert not await domain.draft_ended(conn, "outbox", "r1")


class _QuotaSpent(InvalidRequest):
    pass


class _CheckedDraft(draft_plugin.DraftAdapter):
    """A draft kind whose own enqueue check refuses every request (a spent quota)."""

    @classmethod
    def check_enqueue(cls, conn: Any, check: EnqueueCheck) -> None:
        raise _QuotaSpent("draft", f"no drafts left for {check.request.workspace_id}")

    @classmethod
    async def acheck_enqueue(cls, conn: Any, check: EnqueueCheck) -> None:
        cls.check_enqueue(conn, check)


async def test_a_kinds_enqueue_check_refuses_a_submit_before_anything_is_written(
    issues_db: OutboxTestDatabase,
) -> None:
    issues_db.registry.unregister("DRAFT_REPORT")
    issues_db.register_kind(_CheckedDraft)
    draft_plugin.ENABLED = True
    values: dict[str, Any] = {
        "report_id": "r1",
        "workspace_id": "ws-1",
        "reporter_account_id": REPORTER,
        "title": "t",
        "text": TEXT,
        "outbox": issues_db.outbox,
    }
    # The connection commits when its block ends: a half-written submit would be kept.
    with issues_db.connect() as conn, pytest.raises(_QuotaSpent, match="no drafts left"):
        submit_report(conn, **values)
    aconn = await issues_db.aconnect()
    async with aconn:
        with pytest.raises(_QuotaSpent):
            await asubmit_report(aconn, **values)
    assert rows(issues_db) == (0, 0, 0)
