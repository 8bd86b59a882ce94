"""The model's context limit (issue 31, item 3 for the draft): a report that cannot fit the
configured context is refused at enqueue, before anything is written, on every enqueue path;
a report the model itself refuses as too long ends CONTEXT_LENGTH_EXCEEDED after its one call,
and the report is filed with its own text without waiting."""

from __future__ import annotations

import pytest

from outbox_core import ActionRequest, ActionState, ConfigurationError, InvalidRequest, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_draft import DraftSettings
from outbox_draft.adapter import CONTEXT_LENGTH_EXCEEDED
from outbox_draft.prompt import fitting_chars
from outbox_draft.testing import ModelTestServer, serve_draft
from outbox_draft.testing.server import ContextWording
from outbox_issues import FilingState, submit_report
from outbox_issues.domain import lane
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import REPORTER, TITLE, action, filing, store_report, submit

CONTEXT = 1200  # with max_tokens 800 and the system prompt, room for about 1,000 characters
FITS = "The export does nothing. " * 30  # 750 characters
TOO_LONG = "The export does nothing. " * 80  # 2,000 characters


def counts(db: OutboxTestDatabase) -> tuple[int, int]:
    return (
        db.scalar("SELECT count(*) FROM {schema}.issue_report"),
        db.scalar("SELECT count(*) FROM {schema}.agent_action"),
    )


def test_a_report_that_cannot_fit_the_configured_context_is_refused_at_submit_nothing_written(
    filing_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    serve_draft(filing_db, model_server, context_tokens=CONTEXT)
    with filing_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="OUTBOX_DRAFT_CONTEXT_TOKENS") as refused:
            submit_report(
                conn,
                report_id="r1",
                workspace_id="ws-1",
                reporter_account_id=REPORTER,
                title=TITLE,
                text=TOO_LONG,
                outbox=filing_db.outbox,
            )
        conn.commit()
    assert counts(filing_db) == (0, 0)
    assert f"about {fitting_chars(CONTEXT, 800)} characters" in str(refused.value)
    assert model_server.requests == []

    submitted = submit(filing_db, "r2", text=FITS)  # what fits is drafted
    assert submitted.draft_action_id is not None


def test_the_kinds_enqueue_check_refuses_a_stored_report_too_long_for_the_context(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    # Another path than submit_report: the core's enqueue of a draft of a stored report.
    serve_draft(draft_db, model_server, context_tokens=CONTEXT)
    store_report(draft_db, "r1", text=TOO_LONG)
    store_report(draft_db, "r2", text=FITS)

    def draft_of(report: str) -> ActionRequest:
        return ActionRequest(
            kind="DRAFT_REPORT",
            lane_key=lane(report),
            idempotency_key=f"draft:{report}:1",
            payload={"report": report, "generation": 1},
            workspace_id="ws-1",
        )

    with draft_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="OUTBOX_DRAFT_CONTEXT_TOKENS"):
            draft_db.outbox.enqueue(conn, draft_of("r1"))
        conn.rollback()
        draft_db.outbox.enqueue(conn, draft_of("r2"))
        conn.commit()
    assert [
        row[0] for row in draft_db.rows("SELECT idempotency_key FROM {schema}.agent_action")
    ] == ["draft:r2:1"]


async def test_the_async_enqueue_check_refuses_it_too(
    draft_db: OutboxTestDatabase, model_server: ModelTestServer
) -> None:
    serve_draft(draft_db, model_server, context_tokens=CONTEXT)
    store_report(draft_db, "r1", text=TOO_LONG)
    request = ActionRequest(
        kind="DRAFT_REPORT",
        lane_key=lane("r1"),
        idempotency_key="draft:r1:1",
        payload={"report": "r1", "generation": 1},
        workspace_id="ws-1",
    )
    async with await draft_db.aconnect() as conn:
        with pytest.raises(InvalidRequest, match="OUTBOX_DRAFT_CONTEXT_TOKENS"):
            await draft_db.outbox.aenqueue(conn, request)
    assert draft_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


def test_context_tokens_that_leave_no_room_for_a_report_are_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_DRAFT_CONTEXT_TOKENS: must exceed"):
        DraftSettings(base_url="http://proxy/v1", model="m", context_tokens=900)
    assert DraftSettings(context_tokens=CONTEXT).context_tokens == CONTEXT


@pytest.mark.parametrize("wording", ["openai", "litellm", "vllm"])
def test_a_report_the_model_refuses_as_too_long_ends_context_length_exceeded_after_one_call(
    filing_db: OutboxTestDatabase,
    model_server: ModelTestServer,
    tracker_server: GitHubTestServer,
    wording: ContextWording,
) -> None:
    # No context configured here: only the model's 400 tells, in each server's words.
    model_server.context_limit(1000, wording=wording)

    submit(filing_db, text=TOO_LONG)
    filing_db.drain()

    assert action(filing_db, "draft:r1:1") == (ActionState.FAILED, CONTEXT_LENGTH_EXCEEDED, 1)
    assert len(model_server.completions()) == 1  # no retry
    # The report did not wait: its issue is filed with its own title and text.
    assert action(filing_db, "file_issue:r1:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [issue] = tracker_server.issues_in(PUBLIC)
    assert issue.title == TITLE and TOO_LONG.strip() in issue.body
    assert filing(filing_db).state is FilingState.FILED
    detail = filing_db.scalar(
        "SELECT last_detail FROM {schema}.agent_action WHERE idempotency_key = 'draft:r1:1'"
    )
    assert detail.startswith("HTTP 400") and "do not fit the model's context" in detail
