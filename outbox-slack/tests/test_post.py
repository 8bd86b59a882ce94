"""A turn posted in the application's transaction reaches Slack once, as one message."""

from __future__ import annotations

import asyncio

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import EVENT_TYPE, SLACK_REDACTED, idempotency_key, redact
from outbox_slack.testing import SlackTestServer, serve_slack

from .conftest import CHANNEL, action, post, readback_ref, run_to_end


def test_a_turn_is_posted_once_as_one_message_with_its_metadata(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1", count=3)

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [message] = slack_server.posts
    assert message.channel == CHANNEL
    assert message.text == "text 0\n\ntext 1\n\ntext 2"
    assert message.metadata == {
        "event_type": EVENT_TYPE,
        "event_payload": {
            "idempotency_key": idempotency_key("t1"),
            "turn_id": "t1",
            "entries": [
                {"id": "t1-q0", "kind": "question"},
                {"id": "t1-q1", "kind": "digest"},
                {"id": "t1-q2", "kind": "question"},
            ],
        },
    }
    assert readback_ref(slack_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["chat.postMessage"] == 1
    assert slack_server.requests["conversations.history"] == 0


def test_the_ended_hook_stores_the_message_reference_on_the_entries(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1", count=2)

    slack_db.drain()

    [message] = slack_server.posts
    rows = slack_db.rows(
        "SELECT message_channel, message_ts, outcome FROM {schema}.slack_entry ORDER BY position"
    )
    assert rows == [(CHANNEL, message.ts, None), (CHANNEL, message.ts, None)]


def test_a_threaded_turn_posts_into_its_thread_in_the_threads_lane(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    parent = slack_server.add_message(CHANNEL, "the question's thread")
    post(slack_db, "t1", thread_ts=parent.ts)

    slack_db.drain()

    [message] = slack_server.posts
    assert message.thread_ts == parent.ts
    lane = slack_db.scalar("SELECT lane_key FROM {schema}.agent_action")
    assert lane == f"slack:{CHANNEL}:{parent.ts}"


def test_redacted_entries_are_left_out_and_a_fully_redacted_turn_is_not_posted(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1", count=2)
    post(slack_db, "t2", count=1)
    with slack_db.connect() as conn:
        redact(conn, "t1-q0", outbox=slack_db.outbox)
        redact(conn, "t2-q0", outbox=slack_db.outbox)

    slack_db.drain()

    assert [message.text for message in slack_server.posts] == ["text 1"]
    # t2's only entry was redacted while its action was live: it ended without a post, and
    # its ending removed it.
    assert action(slack_db, "t2") is None
    assert slack_db.rows(
        "SELECT outcome, stop_reason FROM {schema}.slack_entry WHERE turn_id = 't2'"
    ) == [("CANCELLED", SLACK_REDACTED)]


def test_without_a_token_every_post_ends_failed_not_configured(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, token=None)
    post(outbox_db, "t1")

    outbox_db.drain()

    assert action(outbox_db, "t1") == (ActionState.FAILED, StopReason.NOT_CONFIGURED, 1)
    assert slack_server.requests["chat.postMessage"] == 0


def test_a_post_is_never_resent_by_slack_sdk(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    # slack_sdk's default retry handler resends a request whose connection dropped; for a post
    # that would be a second message. The server drops the connection without recording: the
    # post client must not resend it (one request), and the attempt reads back instead.
    slack_server.drop_before_recording("chat.postMessage")
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    assert slack_server.requests["chat.postMessage"] == 1
    assert action(slack_db, "t1") == (ActionState.CANCELLED, StopReason.ABSENT, 2)
    assert slack_server.posts == []


def test_the_read_client_keeps_slack_sdks_connection_retry(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording("chat.postMessage")
    slack_server.drop_before_recording("conversations.history")
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    # The dropped history request was resent by slack_sdk within the same attempt.
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["conversations.history"] == 2
    assert len(slack_server.posts) == 1


def test_the_async_entry_point_posts_in_an_async_transaction(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    from outbox_slack import apost_turn

    from .conftest import entries

    async def go() -> int:
        async with await slack_db.aconnect() as conn:
            enqueued = await apost_turn(
                conn, "t1", entries("t1", 2), workspace_id="W1", outbox=slack_db.outbox
            )
            return enqueued.id

    asyncio.run(go())
    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert len(slack_server.posts) == 1


def test_the_readmes_example_runs_as_written(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    from outbox_slack import Entry, post_turn

    serve_slack(outbox_db, slack_server, readback_window_seconds=0)
    slack_server.drop_after_recording()
    with outbox_db.connect() as conn:
        post_turn(
            conn,
            "t1",
            [Entry("q1", "question", "C0TEST", "hi")],
            workspace_id="W1",
            outbox=outbox_db.outbox,
        )

    outbox_db.drain()
    outbox_db.drain()

    assert len(slack_server.posts) == 1
    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
