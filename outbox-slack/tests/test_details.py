"""What each attempt leaves on the action as its detail: Slack's error code (and the HTTP status
when it is not 200), never the token, the channel's messages or the turn's text."""

from __future__ import annotations

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_slack import ERROR_REASONS, idempotency_key
from outbox_slack.testing import TOKEN, SlackTestServer

from .conftest import CHANNEL, post, run_to_end


def detail(db: OutboxTestDatabase, turn: str) -> tuple[str | None, str | None]:
    row = db.rows(
        "SELECT last_result, last_detail FROM {schema}.agent_action WHERE idempotency_key = %s",
        (idempotency_key(turn),),
    )[0]
    return row[0], row[1]


def clean(text: str | None) -> bool:
    """Nothing of the token, the channel or the posted text ("text 0", conftest.entries)."""
    return text is not None and not any(
        secret in text for secret in (TOKEN, "xoxb", CHANNEL, "text 0")
    )


@pytest.mark.parametrize("error", sorted(ERROR_REASONS))
def test_a_refused_post_keeps_slacks_error_code(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer, error: str
) -> None:
    slack_server.fail("chat.postMessage", error)
    post(slack_db, "t1")
    slack_db.drain()
    assert detail(slack_db, "t1") == ("Failed", f"Slack {error}")


@pytest.mark.parametrize(
    ("error", "status", "result", "expected"),
    [
        ("ratelimited", 429, "Defer", "Slack ratelimited (HTTP 429), waiting 7 s"),
        ("service_unavailable", 200, "Retry", "Slack service_unavailable"),
        ("internal_error", 200, "Reread", "Slack internal_error"),
        ("fatal_error", 503, "Reread", "Slack fatal_error (HTTP 503)"),
    ],
)
def test_a_post_slack_did_not_take_keeps_its_code_and_status(
    slack_db: OutboxTestDatabase,
    slack_server: SlackTestServer,
    error: str,
    status: int,
    result: str,
    expected: str,
) -> None:
    slack_server.fail("chat.postMessage", error, status=status, retry_after=7)
    post(slack_db, "t1")
    slack_db.drain()
    got = detail(slack_db, "t1")
    assert got == (result, expected)
    assert clean(got[1])


def test_a_history_that_cannot_be_read_keeps_the_reads_error(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.fail("chat.postMessage", "internal_error")
    slack_server.fail("conversations.history", "missing_scope")
    post(slack_db, "t1")
    run_to_end(slack_db, "t1")
    assert detail(slack_db, "t1") == ("Uncertain", "conversations.history: Slack missing_scope")


def test_a_post_that_went_through_keeps_no_secret(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    post(slack_db, "t1")
    slack_db.drain()
    result, text = detail(slack_db, "t1")
    assert result == "Done" and (text is None or clean(text))
