"""After an unknown write the attempt only reads: it finds the post by its metadata, proves it
absent only from a complete read begun late enough, and stays uncertain when it cannot read."""

from __future__ import annotations

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import SLACK_HISTORY_UNREADABLE
from outbox_slack.testing import SlackTestServer, serve_slack

from .conftest import CHANNEL, action, post, readback_ref, run_to_end


def test_a_post_slack_shows_late_is_found_by_a_later_read_without_a_second_post(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=600.0)
    slack_server.hide_new_posts(reads=2)
    slack_server.drop_after_recording()
    post(outbox_db, "t1")

    run_to_end(outbox_db, "t1")

    [message] = slack_server.posts
    # Two complete reads missed it (too soon to call it absent: Reread, no attempt spent), the
    # third found it.
    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(outbox_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["chat.postMessage"] == 1
    assert slack_server.requests["conversations.history"] == 3


def test_a_complete_read_sooner_than_the_window_rereads_and_never_posts(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=600.0)
    slack_server.drop_before_recording()
    post(outbox_db, "t1", max_attempts=3)

    outbox_db.drain()
    outbox_db.drain()
    # The read found nothing, but ten minutes have not passed: it waits out the window, and
    # the read spends no attempt.
    assert action(outbox_db, "t1") == (ActionState.EXECUTING, None, 1)
    wait = outbox_db.scalar(
        "SELECT extract(epoch FROM lease_until - now())::int FROM {schema}.agent_action"
    )
    assert wait > 500
    for _ in range(3):  # read again and again (drain makes it due): never posted again
        outbox_db.drain()

    assert action(outbox_db, "t1") == (ActionState.EXECUTING, None, 1)
    assert slack_server.requests["chat.postMessage"] == 1
    assert slack_server.requests["conversations.history"] == 4


def test_the_read_covers_the_fences_time_with_metadata_and_both_bounds(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_before_recording()
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    [args] = [args for method, args in slack_server.bodies if method == "conversations.history"]
    fenced = slack_db.scalar("SELECT extract(epoch FROM now())::float8")
    assert args["channel"] == CHANNEL
    assert args["include_all_metadata"] in ("1", "true", True)
    assert float(args["oldest"]) < fenced < float(args["latest"]) + 120
    assert float(args["latest"]) - float(args["oldest"]) == pytest.approx(60 + 2 * 120, abs=1)
    assert int(args["limit"]) == 15


def test_history_pages_are_followed_and_the_cursor_carries_across_rereads(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(
        outbox_db,
        slack_server,
        readback_window_seconds=0.0,
        readback_page_limit=2,
        readback_pages_per_attempt=2,
    )
    slack_server.drop_after_recording()
    post(outbox_db, "t1")
    outbox_db.drain()  # the post, dropped after it was recorded
    for n in range(7):  # newer traffic: the post is on the fourth page of two
        slack_server.add_message(CHANNEL, f"later {n}")

    run_to_end(outbox_db, "t1")

    # The second run read pages 1-2 and kept the cursor on the turn (a read: no attempt spent);
    # the third went on from page 3.
    [message] = slack_server.posts
    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(outbox_db, "t1") == f"{CHANNEL}:{message.ts}"
    cursors = [
        args.get("cursor")
        for method, args in slack_server.bodies
        if method == "conversations.history"
    ]
    assert len(cursors) == 4 and cursors[0] is None and all(cursors[1:])
    assert len(set(cursors[1:])) == 3
    assert outbox_db.scalar("SELECT readback_cursor FROM {schema}.slack_turn") is None


def test_a_threaded_post_is_read_back_from_its_thread(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    parent = slack_server.add_message(CHANNEL, "the thread")
    slack_server.drop_after_recording()
    post(slack_db, "t1", thread_ts=parent.ts)

    run_to_end(slack_db, "t1")

    [message] = slack_server.posts
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(slack_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["conversations.replies"] == 1
    assert slack_server.requests["conversations.history"] == 0


def test_anothers_message_with_other_metadata_is_not_taken_for_the_post(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_before_recording()
    post(slack_db, "t1")
    slack_db.drain()
    slack_server.add_message(
        CHANNEL,
        "not ours",
        metadata={
            "event_type": "outbox_post",
            "event_payload": {"idempotency_key": "slack_post:t2"},
        },
    )

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.CANCELLED, StopReason.ABSENT, 2)


@pytest.mark.parametrize(
    "error",
    ["missing_scope", "not_in_channel", "channel_not_found", "invalid_auth", "invalid_cursor"],
)
def test_history_that_cannot_be_read_leaves_the_post_uncertain(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, error: str
) -> None:
    slack_server.drop_after_recording()
    slack_server.fail("conversations.history", error)
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.UNCERTAIN, SLACK_HISTORY_UNREADABLE, 2)
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_history_page_that_breaks_off_leaves_the_post_uncertain(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_before_recording()
    slack_server.break_cursor()
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.UNCERTAIN, SLACK_HISTORY_UNREADABLE, 2)
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_transient_history_failure_rereads_and_then_finds_the_post(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    slack_server.server_error("conversations.history", status=502)
    slack_server.fail("conversations.history", "internal_error")
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    # Two failed reads spent no attempt.
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["chat.postMessage"] == 1
    assert slack_server.requests["conversations.history"] == 3


def test_a_rate_limited_history_waits_retry_after_and_spends_no_attempt(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    slack_server.rate_limit("conversations.history", retry_after=42, times=None)
    post(slack_db, "t1", max_attempts=2)

    for _ in range(4):  # more reads than the action has attempts
        slack_db.drain()
        assert action(slack_db, "t1") == (ActionState.EXECUTING, None, 1)
    wait = slack_db.scalar(
        "SELECT extract(epoch FROM lease_until - now())::int FROM {schema}.agent_action"
    )
    assert 38 <= wait <= 42
    assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == (
        "conversations.history: Slack ratelimited (HTTP 429): Retry-After 42 s"
    )
    slack_server.clear_faults()

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["chat.postMessage"] == 1


def test_the_non_marketplace_history_limit_is_met_by_carrying_the_cursor(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=0.0, readback_page_limit=100)
    slack_server.limit_history(per_minute=1, page_max=15)
    slack_server.drop_after_recording()
    post(outbox_db, "t1")
    outbox_db.drain()
    for n in range(20):
        slack_server.add_message(CHANNEL, f"later {n}")

    outbox_db.drain()  # page 1 (15 messages, capped), then 429 on page 2: cursor kept
    assert action(outbox_db, "t1") == (ActionState.EXECUTING, None, 1)
    assert outbox_db.scalar("SELECT readback_cursor FROM {schema}.slack_turn") is not None
    slack_server.limit_history(per_minute=100, page_max=15)  # a minute later

    run_to_end(outbox_db, "t1")

    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_token_removed_after_an_unknown_write_leaves_the_post_uncertain(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    post(slack_db, "t1")
    slack_db.drain()
    serve_slack(slack_db, slack_server, token=None)

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.UNCERTAIN, SLACK_HISTORY_UNREADABLE, 2)
    assert slack_server.requests["chat.postMessage"] == 1
