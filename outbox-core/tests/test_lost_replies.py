"""An ending whose write committed but whose reply was lost (the connection cut once the server
had answered) is written again, changes nothing the second time, and must still be reported
once, as ended: its log event and its count, not `action.end.stale`."""

from __future__ import annotations

import logging

import pytest

from outbox_core import ActionRequest
from outbox_core.executor import Executor
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.pgproxy import ReplyLosingProxy


def events(caplog: pytest.LogCaptureFixture, name: str, action_id: int) -> int:
    return sum(
        1
        for record in caplog.records
        if getattr(record, "event", None) == name
        and getattr(record, "action.id", None) == action_id
    )


async def test_an_ending_committed_before_its_reply_was_lost_is_reported_once_as_ended(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outbox")
    with db.connect() as conn:
        x = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lost", "lost")).id
        conn.commit()
    async with ReplyLosingProxy(db.url).running() as proxy:
        proxy.lose_reply_to(b"-- settle\n")
        async with Executor(db.outbox, proxy.conninfo, settings=db.settings) as executor:
            await executor.drain(timeout=30)
    assert proxy.lost == 1
    assert db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (x,)) == "DONE"
    assert events(caplog, "action.end.stale", x) == 0
    assert events(caplog, "action.ended.done", x) == 1


async def test_the_next_head_a_lost_batch_claimed_is_run_not_left_to_its_lease(
    db: OutboxTestDatabase,
) -> None:
    """The lost settle also claimed the lane's next head (a chained claim): it runs now, once,
    instead of sitting EXECUTING until its lease ends and a reclaim spends another attempt."""
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "chain", "first"))
        y = db.outbox.enqueue(
            conn, ActionRequest("TEST_NOOP", "chain", "second", max_attempts=1)
        ).id
        conn.commit()
    async with ReplyLosingProxy(db.url).running() as proxy:
        proxy.lose_reply_to(b"-- settle\n")
        async with Executor(db.outbox, proxy.conninfo, settings=db.settings) as executor:
            await executor.drain(timeout=30)
    assert proxy.lost == 1
    row = db.rows("SELECT state, attempt FROM {schema}.agent_action WHERE id = %s", (y,))
    assert row == [("DONE", 1)]
