"""post_turn: a turn's entries stored and its one SLACK_POST enqueued in one transaction."""

from __future__ import annotations

import threading

import pytest

from outbox_core import ActionState, InvalidRequest, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import Entry, TurnAlreadyPosted, post_turn, redact
from outbox_slack.testing import SlackTestServer

from .conftest import CHANNEL, action, entries, post


def test_posting_a_turn_twice_returns_the_first_action_and_stores_nothing_twice(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    first = post(slack_db, "t1", count=2)
    with slack_db.connect() as conn:
        again = post_turn(conn, "t1", entries("t1", 2), workspace_id="W1", outbox=slack_db.outbox)

    assert (again.id, again.created) == (first, False)
    assert slack_db.scalar("SELECT count(*) FROM {schema}.slack_entry") == 2
    assert slack_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 1
    slack_db.drain()
    assert len(slack_server.posts) == 1


def test_a_turn_and_its_post_exist_only_when_the_transaction_commits(
    slack_db: OutboxTestDatabase,
) -> None:
    with slack_db.connect() as conn:
        post_turn(conn, "t1", entries("t1"), workspace_id="W1", outbox=slack_db.outbox)
        conn.rollback()

    assert slack_db.scalar("SELECT count(*) FROM {schema}.slack_turn") == 0
    assert slack_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


def test_two_concurrent_transactions_posting_one_turn_make_one_action_and_one_post(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    first = slack_db.connect()
    second = slack_db.connect()
    try:
        made = post_turn(first, "t1", entries("t1", 2), workspace_id="W1", outbox=slack_db.outbox)
        answers: list[object] = []

        def other() -> None:
            answers.append(
                post_turn(second, "t1", entries("t1", 2), workspace_id="W1", outbox=slack_db.outbox)
            )
            second.commit()

        thread = threading.Thread(target=other)
        thread.start()
        # The second waits on the first's uncommitted turn row.
        _wait_for_lock_wait(slack_db)
        first.commit()
        thread.join(30)
    finally:
        first.close()
        second.close()

    [again] = answers
    assert (again.id, again.created) == (made.id, False)
    assert slack_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 1
    assert slack_db.scalar("SELECT count(*) FROM {schema}.slack_entry") == 2
    slack_db.drain()
    assert len(slack_server.posts) == 1


def _wait_for_lock_wait(db: OutboxTestDatabase) -> None:
    with db.connect(autocommit=True) as conn:
        for _ in range(600):
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return
            conn.execute("SELECT pg_sleep(0.05)")
    raise AssertionError("the second post_turn never waited for the first")


def test_a_turn_whose_post_was_removed_by_redaction_is_refused(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1")
    slack_db.drain()
    with slack_db.connect() as conn:
        assert redact(conn, "t1-q0", outbox=slack_db.outbox).action_removed
    assert action(slack_db, "t1") is None

    with slack_db.connect() as conn, pytest.raises(TurnAlreadyPosted, match="never posted again"):
        post_turn(conn, "t1", entries("t1"), workspace_id="W1", outbox=slack_db.outbox)
    slack_db.drain()
    assert len(slack_server.posts) == 1


@pytest.mark.parametrize(
    ("turn_entries", "field"),
    [
        ([], "entries"),
        (
            [Entry("a", "question", CHANNEL, "x"), Entry("b", "digest", "C0OTHER", "y")],
            "entries[1]",
        ),
        ([Entry("a", "question", CHANNEL, "x"), Entry("a", "digest", CHANNEL, "y")], "entries[1]"),
        ([Entry("a", "note", CHANNEL, "x")], "entries[0]"),  # type: ignore[arg-type]
        ([Entry("a", "question", CHANNEL, " ")], "entries[0]"),
    ],
)
def test_a_turn_that_is_not_one_message_is_refused_and_nothing_is_written(
    slack_db: OutboxTestDatabase, turn_entries: list[Entry], field: str
) -> None:
    with slack_db.connect() as conn, pytest.raises(InvalidRequest) as refused:
        post_turn(conn, "t1", turn_entries, workspace_id="W1", outbox=slack_db.outbox)
    assert refused.value.field == field
    assert slack_db.scalar("SELECT count(*) FROM {schema}.slack_turn") == 0


def test_the_subject_and_workspace_are_the_actions(slack_db: OutboxTestDatabase) -> None:
    post(slack_db, "t1", subject_account_id="acct-7")
    row = slack_db.rows(
        "SELECT workspace_id, subject_account_id, lane_key FROM {schema}.agent_action"
    )
    assert row == [("W1", "acct-7", f"slack:{CHANNEL}")]
    assert slack_db.scalar("SELECT payload FROM {schema}.agent_action") == {
        "turn_id": "t1",
        "entry_ids": ["t1-q0"],
    }


def test_an_expired_post_is_cancelled_and_its_entries_keep_no_reference(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1")
    slack_db.execute("UPDATE {schema}.agent_action SET expires_at = now() - interval '1 second'")
    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.CANCELLED, StopReason.EXPIRED, 0)
    assert slack_server.posts == []
    assert slack_db.scalar("SELECT message_ts FROM {schema}.slack_entry") is None


def test_an_entry_of_another_turn_is_refused_and_the_transaction_stays_usable(
    slack_db: OutboxTestDatabase,
) -> None:
    post(slack_db, "t1")
    with slack_db.connect() as conn:
        with pytest.raises(InvalidRequest, match="another turn"):
            post_turn(
                conn,
                "t2",
                [Entry("t1-q0", "question", CHANNEL, "x")],
                workspace_id="W1",
                outbox=slack_db.outbox,
            )
        post_turn(conn, "t3", entries("t3"), workspace_id="W1", outbox=slack_db.outbox)

    assert slack_db.rows("SELECT turn_id FROM {schema}.slack_turn ORDER BY turn_id") == [
        ("t1",),
        ("t3",),
    ]
