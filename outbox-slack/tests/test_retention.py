"""A terminal SLACK_POST is kept while any of its entries is unredacted; the 30-day sweep never
removes it; redaction removes it; erasure deletes a subject's turns, entries and posts."""

from __future__ import annotations

import asyncio
import threading

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.erasure import erase_subject
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import redact
from outbox_slack.testing import SlackTestServer

from .conftest import action, post


def _sweep(db: OutboxTestDatabase) -> int:
    async def go() -> int:
        async with db.executor(retention_days=1e-9) as executor:
            return await executor.sweep_retention()

    return asyncio.run(go())


def test_a_terminal_post_past_the_retention_survives_the_sweep(
    slack_db: OutboxTestDatabase,
) -> None:
    post(slack_db, "t1")
    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)

    _sweep(slack_db)

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)


def test_the_post_stays_while_any_entry_is_unredacted_and_goes_with_the_last(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1", count=2)
    slack_db.drain()
    [message] = slack_server.posts

    with slack_db.connect() as conn:
        first = redact(conn, "t1-q0", outbox=slack_db.outbox)
    assert (first.redacted, first.action_removed) == (True, False)
    assert action(slack_db, "t1") is not None

    with slack_db.connect() as conn:
        last = redact(conn, "t1-q1", outbox=slack_db.outbox)
        # Removed in the redaction's own transaction: not before it commits.
        assert last.action_removed
        assert action(slack_db, "t1") is not None
    assert action(slack_db, "t1") is None
    assert (
        slack_db.rows(
            "SELECT text, message_ts, outcome, stop_reason FROM {schema}.slack_entry ORDER BY position"
        )
        == [(None, message.ts, "DONE", "COMPLETED")] * 2
    )


def test_a_redaction_that_rolls_back_keeps_the_post(slack_db: OutboxTestDatabase) -> None:
    post(slack_db, "t1")
    slack_db.drain()
    with slack_db.connect() as conn:
        assert redact(conn, "t1-q0", outbox=slack_db.outbox).action_removed
        conn.rollback()
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)


def test_a_redaction_while_the_post_is_live_removes_it_when_it_ends(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    post(slack_db, "t1")
    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.EXECUTING, None, 1)

    with slack_db.connect() as conn:
        assert not redact(conn, "t1-q0", outbox=slack_db.outbox).action_removed
    assert action(slack_db, "t1") is not None

    slack_db.drain()

    [message] = slack_server.posts
    assert action(slack_db, "t1") is None
    assert slack_db.rows("SELECT message_ts, outcome FROM {schema}.slack_entry") == [
        (message.ts, "DONE")
    ]


@pytest.mark.parametrize("ending", ["DONE", "FAILED"])
def test_a_redaction_that_commits_while_the_post_ends_is_not_missed(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, ending: str
) -> None:
    # The redaction holds the turn's row while the ending waits for it; once the redaction
    # commits, the ending sees every entry redacted and removes the action.
    if ending == "FAILED":
        slack_server.fail("chat.postMessage", "channel_not_found")
    post(slack_db, "t1")
    conn = slack_db.connect()
    try:
        redact(conn, "t1-q0", outbox=slack_db.outbox)  # uncommitted: the action is live
        ran = threading.Thread(target=slack_db.drain)
        ran.start()
        _wait_for_lock_wait(slack_db)
        conn.commit()
        ran.join(60)
    finally:
        conn.close()
    assert action(slack_db, "t1") is None


def _wait_for_lock_wait(db: OutboxTestDatabase) -> None:
    with db.connect(autocommit=True) as conn:
        for _ in range(600):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0]:
                return
            conn.execute("SELECT pg_sleep(0.05)")
    raise AssertionError("nothing waited for the redaction's lock")


def test_erasure_deletes_the_subjects_turns_entries_and_posts(
    slack_db: OutboxTestDatabase,
) -> None:
    post(slack_db, "t1", subject_account_id="acct-1")
    post(slack_db, "t2", subject_account_id="acct-2")
    slack_db.drain()

    async def erase() -> None:
        async with await slack_db.aconnect() as conn:
            report = await erase_subject(conn, "acct-1", outbox=slack_db.outbox)
            assert report.actions == 1
            assert report.catalogs["slack"] == 1

    asyncio.run(erase())

    assert action(slack_db, "t1") is None
    assert action(slack_db, "t2") is not None
    assert slack_db.rows("SELECT turn_id FROM {schema}.slack_turn") == [("t2",)]
    assert slack_db.rows("SELECT entry_id FROM {schema}.slack_entry") == [("t2-q0",)]


def test_erasure_deletes_the_turns_in_the_erasing_outboxs_schema_not_the_environments(
    slack_db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    post(slack_db, "t1", subject_account_id="acct-1")
    slack_db.drain()
    monkeypatch.setenv("OUTBOX_SCHEMA", "some_other_schema")  # not the erasing outbox's

    async def erase() -> None:
        async with await slack_db.aconnect() as conn:
            report = await erase_subject(conn, "acct-1", outbox=slack_db.outbox)
            assert report.catalogs["slack"] == 1

    asyncio.run(erase())
    assert slack_db.rows("SELECT turn_id FROM {schema}.slack_turn") == []


def test_erasure_before_the_post_means_it_is_never_posted(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1", subject_account_id="acct-1")

    async def erase() -> None:
        async with await slack_db.aconnect() as conn:
            await erase_subject(conn, "acct-1", outbox=slack_db.outbox)

    asyncio.run(erase())
    slack_db.drain()

    assert slack_server.posts == []
