"""Fixtures and helpers of outbox-draft's tests."""

from __future__ import annotations

from typing import Any

import pytest

from outbox_core import ActionRequest, ActionState
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.plugin_listed import plugin_listed_first
from outbox_draft import draft_request
from outbox_draft.testing import ModelTestServer, serve_draft
from outbox_issues import Filing, get_filing, submit_report
from outbox_issues.domain import lane, queries
from outbox_issues.hookspecs import DraftContext
from outbox_issues.testing import GitHubTestServer, serve_issues

REPORTER = "acct-ada"
TITLE = "Export does nothing"
TEXT = "The export button does nothing when the list is empty."


pytest_collection_modifyitems = plugin_listed_first
"""The plugin's first test runs first: `outbox plugins` lists it and its kinds."""


@pytest.fixture
def draft_db(outbox_db: OutboxTestDatabase, model_server: ModelTestServer) -> OutboxTestDatabase:
    """A fresh database whose DRAFT_REPORT talks to the loopback model server."""
    serve_draft(outbox_db, model_server)
    return outbox_db


@pytest.fixture
def filing_db(draft_db: OutboxTestDatabase, tracker_server: GitHubTestServer) -> OutboxTestDatabase:
    """The same, with the issue kinds talking to the loopback tracker."""
    serve_issues(draft_db, tracker_server, listing_lag_seconds=0.0)
    return draft_db


def store_report(db: OutboxTestDatabase, report: str = "r1", text: str = TEXT) -> None:
    """A report and its filing (NEW), as submit_report stores them, without any action."""
    sql = queries(db.schema)
    params = {
        "report": report,
        "workspace": "ws-1",
        "reporter": REPORTER,
        "title": TITLE,
        "text": text,
    }
    with db.connect() as conn:
        conn.execute(sql["insert_report"], params)
        conn.execute(sql["insert_filing"], params)


def enqueue_draft(db: OutboxTestDatabase, report: str = "r1", **changes: Any) -> int:
    """Only the draft of the report's first generation (no FILE_ISSUE behind it)."""
    context = DraftContext(
        report_id=report,
        generation=1,
        workspace_id="ws-1",
        lane_key=lane(report),
        idempotency_key=f"draft:{report}:1",
        text=TEXT,
    )
    request = draft_request(context, db.outbox)
    assert isinstance(request, ActionRequest)
    if changes:
        from dataclasses import replace

        request = replace(request, **changes)
    with db.connect() as conn:
        return db.outbox.enqueue(conn, request).id


def submit(db: OutboxTestDatabase, report: str = "r1", **options: Any) -> Any:
    values: dict[str, Any] = {
        "workspace_id": "ws-1",
        "reporter_account_id": REPORTER,
        "title": TITLE,
        "text": TEXT,
    }
    values.update(options)
    with db.connect() as conn:
        return submit_report(conn, report_id=report, outbox=db.outbox, **values)


def action(db: OutboxTestDatabase, key: str) -> tuple[ActionState, str | None, int]:
    """(state, stop reason, attempts counted) of the action holding ``key``."""
    found = db.action_state(key)
    assert found is not None, f"no action holds {key}"
    return found


def filing(db: OutboxTestDatabase, report: str = "r1") -> Filing:
    with db.connect() as conn:
        found = get_filing(conn, report, outbox=db.outbox)
    assert found is not None
    return found


def kept(db: OutboxTestDatabase, report: str = "r1") -> tuple[int | None, str | None, str | None]:
    """(generation, title, body) of the answer kept on the filing."""
    [row] = db.rows(
        "SELECT draft_generation, draft_title, draft_body FROM {schema}.issue_filing "
        "WHERE report_id = %s",
        (report,),
    )
    return row[0], row[1], row[2]


def log_filing_states(db: OutboxTestDatabase) -> None:
    """Record every change of a filing's state in a table of this test's database."""
    db.execute(
        """
        CREATE TABLE {schema}.filing_state_log (
            id serial PRIMARY KEY, report_id text, state text);
        CREATE FUNCTION {schema}.log_filing_state() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                INSERT INTO {schema}.filing_state_log (report_id, state) VALUES (NEW.report_id, NEW.state);
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER log_filing_state AFTER UPDATE ON {schema}.issue_filing
            FOR EACH ROW EXECUTE FUNCTION {schema}.log_filing_state();
        """
    )


def filing_states(db: OutboxTestDatabase, report: str = "r1") -> list[str]:
    rows = db.rows(
        "SELECT state FROM {schema}.filing_state_log WHERE report_id = %s ORDER BY id", (report,)
    )
    return [row[0] for row in rows]


def drain_until_ended(db: OutboxTestDatabase, key: str, *, rounds: int = 12) -> int:
    """Drain until the action holding ``key`` ended (a drain makes waiting actions due once:
    each Retry or Defer takes one more). Returns the drains it took."""
    for done in range(1, rounds + 1):
        db.drain()
        if action(db, key)[0].ended:
            return done
    raise AssertionError(f"{key} did not end in {rounds} drains: {action(db, key)}")
