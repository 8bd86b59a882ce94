"""A read-back takes for the post only a message that the token's own identity posted (the bot
user and bot that ``auth.test`` names): a message carrying the post's metadata from anyone else
(a marker planted ahead of the post, its key being predictable) is ignored and logged."""

from __future__ import annotations

import logging

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import SLACK_HISTORY_UNREADABLE, idempotency_key
from outbox_slack.testing import SlackTestServer

from .conftest import CHANNEL, action, post, readback_ref, run_to_end

AUTHORS: dict[str, dict[str, str | None]] = {
    "another app's bot": {"user": "U0OTHER", "bot_id": "B0OTHER", "app_id": "A0OTHER"},
    "a person": {"user": "U0PERSON", "bot_id": None, "app_id": None},
}


def foreign_markers(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "readback.foreign_marker"]


@pytest.mark.parametrize("author", sorted(AUTHORS))
def test_a_read_back_never_takes_a_marker_another_identity_planted_for_the_post(
    slack_db: OutboxTestDatabase,
    slack_server: SlackTestServer,
    caplog: pytest.LogCaptureFixture,
    author: str,
) -> None:
    slack_server.drop_after_recording()  # the real post is taken, its answer lost
    post(slack_db, "t1")
    slack_db.drain()
    # Newer than the real post: the history (newest first) lists it first.
    planted = slack_server.plant_marker(CHANNEL, idempotency_key("t1"), **AUTHORS[author])

    with caplog.at_level(logging.WARNING, logger="outbox"):
        run_to_end(slack_db, "t1")

    [message] = slack_server.posts
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(slack_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["chat.postMessage"] == 1
    [record] = foreign_markers(caplog)
    assert getattr(record, "action.ref") == planted.ts
    assert getattr(record, "action.kind") == "SLACK_POST"


def test_a_planted_marker_alone_does_not_make_a_post_that_never_arrived_done(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    slack_server.drop_before_recording()  # nothing reached Slack
    post(slack_db, "t1")
    slack_db.drain()
    slack_server.plant_marker(CHANNEL, idempotency_key("t1"))

    with caplog.at_level(logging.WARNING, logger="outbox"):
        run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.CANCELLED, StopReason.ABSENT, 2)
    assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == (
        "not in the history read back (ignored 1 by another author with this key)"
    )
    assert slack_db.scalar("SELECT message_ts FROM {schema}.slack_entry") is None
    assert len(foreign_markers(caplog)) == 1


def test_a_marker_planted_in_the_thread_is_ignored_too(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    parent = slack_server.add_message(CHANNEL, "the thread")
    # Planted ahead of the post: a thread's replies are listed oldest first.
    slack_server.plant_marker(CHANNEL, idempotency_key("t1"), thread_ts=parent.ts)
    slack_server.drop_after_recording()
    post(slack_db, "t1", thread_ts=parent.ts)

    run_to_end(slack_db, "t1")

    [message] = slack_server.posts
    assert readback_ref(slack_db, "t1") == f"{CHANNEL}:{message.ts}"


def test_the_posting_identity_is_asked_of_auth_test_once_per_adapter(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording(times=2)
    post(slack_db, "t1", channel=CHANNEL)
    slack_server.add_channel("C0TWO")
    post(slack_db, "t2", channel="C0TWO")
    slack_db.drain()  # both posts, both answers lost

    slack_db.drain()  # one executor reads both back

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert action(slack_db, "t2") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["auth.test"] == 1


def test_a_read_back_whose_identity_cannot_be_learnt_stays_uncertain(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    slack_server.fail("auth.test", "invalid_auth")
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.UNCERTAIN, SLACK_HISTORY_UNREADABLE, 2)
    assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == (
        "auth.test: Slack invalid_auth"
    )
    assert slack_server.requests["chat.postMessage"] == 1


def test_an_auth_test_that_fails_for_now_is_read_again(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording()
    slack_server.fail("auth.test", "internal_error")
    post(slack_db, "t1")

    run_to_end(slack_db, "t1")

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert slack_server.requests["auth.test"] == 2
    assert slack_server.requests["chat.postMessage"] == 1
