"""The core's read-back rule in SLACK_POST: after a lost answer, history that Slack cannot give
for now (HTTP 5xx, internal_error, a drop, a rate limit) is read again, bounded by time (the
kind's unreadable_for, on the database clock), never by attempts; the wait is Slack's
Retry-After when it names one, else the core's growing wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from outbox_core import ActionState, ConfigurationError, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import SlackPostAdapter
from outbox_slack.testing import SlackTestServer, serve_slack

from .conftest import action, post

OUTAGE_SECONDS = 65.0


async def run_until(db: OutboxTestDatabase, done: Callable[[], bool], seconds: float) -> None:
    """A running executor (its own waits, not drain()'s due-at-once) until ``done()``."""
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=0.2)
    runner = asyncio.create_task(executor.run(stop))
    try:
        deadline = time.monotonic() + seconds
        while not done():
            assert not runner.done(), "the executor stopped"
            assert time.monotonic() < deadline, f"not done within {seconds} s"
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await runner
        await executor.close()


def ended(db: OutboxTestDatabase, turn: str) -> Callable[[], bool]:
    def check() -> bool:
        state = action(db, turn)
        return state is None or state[0] not in (ActionState.ADMITTED, ActionState.EXECUTING)

    return check


@pytest.mark.parametrize(
    ("outage", "detail"),
    [
        ({"status": 503}, "conversations.history: HTTP 503 without a Slack answer: not read"),
        ({"error": "internal_error"}, "conversations.history: Slack internal_error: not read"),
    ],
)
def test_reads_during_a_history_outage_spend_no_attempt_and_say_what_they_saw(
    slack_db: OutboxTestDatabase,
    slack_server: SlackTestServer,
    outage: dict[str, object],
    detail: str,
) -> None:
    slack_server.drop_after_recording()
    post(slack_db, "t1", max_attempts=2)
    slack_db.drain()  # the post, its answer lost
    slack_server.outage(3600, methods=("conversations.history",), **outage)  # type: ignore[arg-type]

    for _ in range(4):  # twice the action's attempts
        slack_db.drain()
        assert action(slack_db, "t1") == (ActionState.EXECUTING, None, 1)
        assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == detail
    assert slack_server.outage_answers == 4
    slack_server.outage(0)
    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert len(slack_server.posts) == 1


def test_a_history_outage_longer_than_a_minute_is_read_at_growing_waits_and_ends_done(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    # The core's waits between reads grow with jitter to the kind's reread_cap (2 min by
    # default); 10 s here, so that the read after the outage comes within seconds of its end.
    serve_slack(
        outbox_db,
        slack_server,
        readback_window_seconds=0,
        adapter_values={"reread_cap": timedelta(seconds=10)},
    )
    slack_server.drop_after_recording()
    post(outbox_db, "t1", max_attempts=3)
    outbox_db.drain()  # the post, its answer lost
    slack_server.outage(OUTAGE_SECONDS)  # every read-back call: HTTP 503
    started = time.monotonic()

    asyncio.run(run_until(outbox_db, ended(outbox_db, "t1"), OUTAGE_SECONDS + 60))

    assert time.monotonic() - started >= OUTAGE_SECONDS
    # More reads than the action has attempts, and far fewer than a flat wait of a second
    # would make in 65 s: at most about 4 in the first 10 s, then one each 5-10 s.
    assert 3 < slack_server.outage_answers <= 20
    [message] = slack_server.posts
    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert outbox_db.scalar("SELECT readback_ref FROM {schema}.agent_action") == (
        f"C0TEST:{message.ts}"
    )
    assert slack_server.requests["chat.postMessage"] == 1


def test_history_unreadable_past_unreadable_for_ends_uncertain_readback_unavailable(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(
        outbox_db,
        slack_server,
        readback_window_seconds=0,
        adapter_values={
            "unreadable_for": timedelta(seconds=3),
            "reread_base": timedelta(milliseconds=100),
            "reread_cap": timedelta(milliseconds=500),
        },
    )
    slack_server.drop_after_recording()
    post(outbox_db, "t1")
    slack_server.outage(3600)

    asyncio.run(run_until(outbox_db, ended(outbox_db, "t1"), 60))

    # The ending read is counted, as any ending is.
    assert action(outbox_db, "t1") == (ActionState.UNCERTAIN, StopReason.READBACK_UNAVAILABLE, 2)
    assert outbox_db.scalar("SELECT last_detail FROM {schema}.agent_action") in (
        "conversations.history: HTTP 503 without a Slack answer: not read",
        "auth.test: HTTP 503 without a Slack answer: not read",
    )
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_readback_window_that_unreadable_for_would_cut_short_is_refused(
    slack_server: SlackTestServer,
) -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_SLACK_READBACK_WINDOW_SECONDS"):
        SlackPostAdapter(settings=slack_server.settings(readback_window_seconds=900))
