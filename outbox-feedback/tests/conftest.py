"""Fixtures and helpers of outbox-feedback's tests: a database whose three kinds talk to the
loopback tracker (outbox-issues' ``tracker_server``), a pull request on it, and a feedback with
a summary and two inline items."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outbox_core import ActionState
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.plugin_listed import plugin_listed_first
from outbox_feedback import (
    Feedback,
    FeedbackSendQueue,
    Item,
    Queued,
    create_feedback,
    get_feedback,
)
from outbox_feedback.testing import copies_on, serve_feedback
from outbox_issues.testing import PUBLIC, GitHubTestServer
from outbox_issues.testing.server import StoredComment

AUTHOR = "acct-grace"
COMMIT = "6dcb09b5b57875f334f61aebed695e2e4193db5e"
ITEMS = (
    Item("i1", "src/app.py", COMMIT, 12, "RIGHT", "Name this `retries`."),
    Item("i2", "src/app.py", COMMIT, 40, "LEFT", "This check was load-bearing."),
)


pytest_collection_modifyitems = plugin_listed_first
"""The plugin's first test runs first: `outbox plugins` lists it and its kinds."""


@pytest.fixture
def feedback_db(
    outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
) -> OutboxTestDatabase:
    serve_feedback(outbox_db, tracker_server)
    return outbox_db


@pytest.fixture
def pull(tracker_server: GitHubTestServer) -> int:
    return tracker_server.add_pull_request(PUBLIC, "Retry the export")


def store(
    db: OutboxTestDatabase,
    pull: int,
    feedback_id: str = "fb-1",
    *,
    items: tuple[Item, ...] = ITEMS,
    summary: str = "Two nits, otherwise fine.",
    **options: Any,
) -> Queued:
    """Store the feedback and queue its first send, in one transaction."""
    with db.connect() as conn:
        create_feedback(
            conn,
            feedback_id,
            outbox=db.outbox,
            workspace_id="ws-1",
            author_account_id=AUTHOR,
            repository=PUBLIC,
            pull_number=pull,
            summary=summary,
            items=items,
        )
        return FeedbackSendQueue(db.outbox).queue(conn, feedback_id, **options)


def queue(db: OutboxTestDatabase, feedback_id: str = "fb-1", **options: Any) -> Queued:
    """Queue a send from async code (it may replace an unstarted one)."""

    async def go() -> Queued:
        async with await db.aconnect() as conn:
            queued = await FeedbackSendQueue(db.outbox).aqueue(conn, feedback_id, **options)
            await conn.commit()
            return queued

    return asyncio.run(go())


def action(db: OutboxTestDatabase, action_id: int) -> tuple[ActionState, str | None]:
    row = db.rows(
        "SELECT state, stop_reason FROM {schema}.agent_action WHERE id = %s", (action_id,)
    )[0]
    return ActionState(row[0]), row[1]


def feedback(db: OutboxTestDatabase, feedback_id: str = "fb-1") -> Feedback:
    with db.connect() as conn:
        found = get_feedback(conn, feedback_id, outbox=db.outbox)
    assert found is not None
    return found


def copies(
    server: GitHubTestServer, pull: int, feedback_id: str = "fb-1"
) -> dict[str, list[StoredComment]]:
    return copies_on(server, PUBLIC, pull, feedback_id)


def one_each(
    server: GitHubTestServer, pull: int, items: tuple[str, ...] = ("summary", "i1", "i2")
) -> dict[str, StoredComment]:
    """Exactly one copy of each item on the tracker, found by marker; returns them."""
    found = copies(server, pull)
    assert {item: len(found.get(item, [])) for item in items} == dict.fromkeys(items, 1)
    assert set(found) == set(items)
    return {item: found[item][0] for item in items}
