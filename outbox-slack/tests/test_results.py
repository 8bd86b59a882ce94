"""The results table of chat.postMessage (adapter.py's docstring), row by row, against the
loopback server: final state, stop reason, attempts counted, posts recorded at the server."""

from __future__ import annotations

import socket

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import ERROR_REASONS, SLACK_REFUSED
from outbox_slack.testing import SlackTestServer, serve_slack

from .conftest import CHANNEL, action, post, readback_ref, run_to_end


@pytest.mark.parametrize(("error", "reason"), sorted(ERROR_REASONS.items()))
def test_a_permanent_slack_error_ends_failed_with_its_stop_reason(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, error: str, reason: str
) -> None:
    slack_server.fail("chat.postMessage", error)
    post(slack_db, "t1")

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.FAILED, reason, 1)
    assert slack_server.posts == []


def test_an_error_outside_the_set_ends_failed_slack_refused(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.fail("chat.postMessage", "some_new_error")
    post(slack_db, "t1")

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.FAILED, SLACK_REFUSED, 1)


def test_the_servers_own_refusals_end_failed_with_their_stop_reasons(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.add_channel("C0OUT", member=False)
    slack_server.add_channel("C0OLD", archived=True)
    post(slack_db, "missing", channel="C0MISSING")
    post(slack_db, "outside", channel="C0OUT")
    post(slack_db, "archived", channel="C0OLD")

    slack_db.drain()

    assert action(slack_db, "missing") == (ActionState.FAILED, "SLACK_CHANNEL_NOT_FOUND", 1)
    assert action(slack_db, "outside") == (ActionState.FAILED, "SLACK_NOT_IN_CHANNEL", 1)
    assert action(slack_db, "archived") == (ActionState.FAILED, "SLACK_IS_ARCHIVED", 1)


def test_a_wrong_token_ends_failed_invalid_auth(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, token="xoxb-wrong")
    post(outbox_db, "t1")

    outbox_db.drain()

    assert action(outbox_db, "t1") == (ActionState.FAILED, "SLACK_INVALID_AUTH", 1)
    assert slack_server.posts == []


@pytest.mark.parametrize("status", [429, 200])
def test_a_rate_limit_defers_without_counting_the_attempt(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, status: int
) -> None:
    slack_server.fail("chat.postMessage", "ratelimited", status=status, retry_after=7)
    post(slack_db, "t1")

    slack_db.drain()

    # Deferred for Retry-After, not counted: due again in 7 s (drain makes it due at once).
    assert action(slack_db, "t1") == (ActionState.ADMITTED, None, 0)
    wait = slack_db.scalar(
        "SELECT extract(epoch FROM due_at - now())::int FROM {schema}.agent_action"
    )
    assert 4 <= wait <= 7
    assert slack_db.scalar("SELECT write_started_at FROM {schema}.agent_action") is None

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert len(slack_server.posts) == 1


def test_a_refused_connection_retries_and_nothing_was_sent(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve_slack(outbox_db, slack_server, base_url=f"http://127.0.0.1:{port}/api/")
    post(outbox_db, "t1", max_attempts=2)

    outbox_db.drain()
    assert action(outbox_db, "t1") == (ActionState.ADMITTED, None, 1)
    assert outbox_db.scalar("SELECT write_started_at FROM {schema}.agent_action") is None

    outbox_db.drain()
    assert action(outbox_db, "t1") == (ActionState.FAILED, StopReason.ATTEMPTS_EXHAUSTED, 2)


def test_a_failed_tls_handshake_retries_and_nothing_was_sent(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    # https:// to the plain-HTTP server: the handshake fails before any request is sent.
    serve_slack(outbox_db, slack_server, base_url=f"https://127.0.0.1:{slack_server.port}/api/")
    post(outbox_db, "t1")

    outbox_db.drain()

    assert action(outbox_db, "t1") == (ActionState.ADMITTED, None, 1)
    assert outbox_db.scalar("SELECT write_started_at FROM {schema}.agent_action") is None
    assert slack_server.requests["chat.postMessage"] == 0


def test_another_http_4xx_without_a_slack_answer_retries(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.server_error("chat.postMessage", status=404)
    post(slack_db, "t1")

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.ADMITTED, None, 1)

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert len(slack_server.posts) == 1


@pytest.mark.parametrize("error", ["service_unavailable", "request_timeout", "team_added_to_org"])
def test_an_error_by_which_slack_did_not_carry_the_post_out_retries(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, error: str
) -> None:
    slack_server.fail("chat.postMessage", error)
    post(slack_db, "t1")

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.ADMITTED, None, 1)
    assert slack_db.scalar("SELECT write_started_at FROM {schema}.agent_action") is None

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert len(slack_server.posts) == 1


@pytest.mark.parametrize("fault", ["internal_error", "fatal_error", "http_500", "http_503"])
def test_an_answer_that_may_follow_a_write_reads_back_and_never_posts_again(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, fault: str
) -> None:
    if fault.startswith("http_"):
        slack_server.server_error("chat.postMessage", status=int(fault[5:]))
    else:
        slack_server.fail("chat.postMessage", fault)
    post(slack_db, "t1")

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.EXECUTING, None, 1)

    run_to_end(slack_db, "t1")

    # The fake recorded nothing: the read-back proves it absent (window 0), never posts again.
    assert action(slack_db, "t1") == (ActionState.CANCELLED, StopReason.ABSENT, 2)
    assert slack_server.requests["chat.postMessage"] == 1
    assert slack_server.requests["conversations.history"] == 1


def test_a_post_dropped_after_slack_took_it_ends_done_by_reading_back(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.drop_after_recording("chat.postMessage")
    post(slack_db, "t1")

    slack_db.drain()
    assert action(slack_db, "t1") == (ActionState.EXECUTING, None, 1)

    run_to_end(slack_db, "t1")

    [message] = slack_server.posts
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(slack_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_post_that_stalls_past_the_timeout_after_recording_reads_back(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=0.0, request_timeout_seconds=0.5)
    slack_server.stall("chat.postMessage", after_recording=True)
    post(outbox_db, "t1")

    run_to_end(outbox_db, "t1")

    [message] = slack_server.posts
    assert action(outbox_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 2)
    assert readback_ref(outbox_db, "t1") == f"{CHANNEL}:{message.ts}"
    assert slack_server.requests["chat.postMessage"] == 1


def test_a_post_that_stalls_before_recording_reads_back_and_ends_absent(
    outbox_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    serve_slack(outbox_db, slack_server, readback_window_seconds=0.0, request_timeout_seconds=0.5)
    slack_server.stall("chat.postMessage")
    post(outbox_db, "t1")

    run_to_end(outbox_db, "t1")

    assert action(outbox_db, "t1") == (ActionState.CANCELLED, StopReason.ABSENT, 2)
    assert slack_server.posts == []
    assert slack_server.requests["chat.postMessage"] == 1
