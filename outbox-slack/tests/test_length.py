"""A turn is one message that Slack keeps whole, or it is not posted: over 40,000 characters it
is refused at enqueue (post_turn and the kind's enqueue check), never posted by the adapter; and
a post that Slack answers with a warning that it altered the message (``message_truncated``) is
not done."""

from __future__ import annotations

import asyncio

import pytest

from outbox_core import ActionRequest, ActionState, InvalidRequest, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_slack import (
    KIND,
    Entry,
    SlackPost,
    apost_turn,
    idempotency_key,
    lane_key,
    post_turn,
)
from outbox_slack.domain import queries
from outbox_slack.message import TEXT_LIMIT
from outbox_slack.testing import SlackTestServer

from .conftest import CHANNEL, action, post

LIMIT_MESSAGE = "Slack keeps 40,000 of a message's text"


def long_entries(turn: str, sizes: list[int], *, char: str = "x") -> list[Entry]:
    return [Entry(f"{turn}-e{n}", "question", CHANNEL, char * size) for n, size in enumerate(sizes)]


def nothing_written(db: OutboxTestDatabase) -> bool:
    return bool(
        db.scalar("SELECT count(*) FROM {schema}.slack_turn") == 0
        and db.scalar("SELECT count(*) FROM {schema}.slack_entry") == 0
        and db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0
    )


@pytest.mark.parametrize(
    ("sizes", "char"),
    [
        ([TEXT_LIMIT + 1], "x"),
        ([20_000, 19_999], "x"),  # 39,999 + the blank line between: 40,001
        ([20_001], "\N{GRINNING FACE}"),  # 20,001 characters, 40,002 UTF-16 code units
    ],
)
def test_a_turn_over_slacks_text_limit_is_refused_by_post_turn_and_nothing_is_written(
    slack_db: OutboxTestDatabase, sizes: list[int], char: str
) -> None:
    with slack_db.connect() as conn, pytest.raises(InvalidRequest, match=LIMIT_MESSAGE) as refused:
        post_turn(
            conn,
            "t1",
            long_entries("t1", sizes, char=char),
            workspace_id="W1",
            outbox=slack_db.outbox,
        )

    assert refused.value.field == "entries"
    assert nothing_written(slack_db)


def test_a_turn_of_exactly_the_limit_is_posted_whole(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    with slack_db.connect() as conn:
        post_turn(
            conn,
            "t1",
            long_entries("t1", [20_000, TEXT_LIMIT - 20_000 - 2]),
            workspace_id="W1",
            outbox=slack_db.outbox,
        )

    slack_db.drain()

    [message] = slack_server.posts
    assert len(message.text) == TEXT_LIMIT
    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)


def test_the_async_entry_point_refuses_a_turn_over_the_limit(
    slack_db: OutboxTestDatabase,
) -> None:
    async def go() -> None:
        async with await slack_db.aconnect() as conn:
            await apost_turn(
                conn,
                "t1",
                long_entries("t1", [TEXT_LIMIT + 1]),
                workspace_id="W1",
                outbox=slack_db.outbox,
            )

    with pytest.raises(InvalidRequest, match=LIMIT_MESSAGE):
        asyncio.run(go())
    assert nothing_written(slack_db)


def store_turn(db: OutboxTestDatabase, turn: str, text: str) -> ActionRequest:
    """A turn and its one entry stored as post_turn stores them, and the request that posts it:
    what an enqueue that is not post_turn's (the core's enqueue, enqueue_many) is handed."""
    sql = queries(db.schema)
    with db.connect() as conn:
        conn.execute(
            sql["insert_turn"],
            {
                "turn_id": turn,
                "workspace_id": "W1",
                "channel": CHANNEL,
                "thread_ts": None,
                "subject": None,
                "key": idempotency_key(turn),
            },
        )
        conn.execute(
            sql["insert_entries"],
            {
                "turn_id": turn,
                "ids": [f"{turn}-e0"],
                "kinds": ["question"],
                "positions": [0],
                "channels": [CHANNEL],
                "texts": [text],
            },
        )
    return ActionRequest(
        kind=KIND,
        lane_key=lane_key(CHANNEL, None),
        idempotency_key=idempotency_key(turn),
        payload=SlackPost(turn_id=turn, entry_ids=[f"{turn}-e0"]),
        workspace_id="W1",
    )


@pytest.mark.parametrize("path", ["enqueue", "enqueue_many", "aenqueue", "aenqueue_many"])
def test_the_kinds_enqueue_check_refuses_a_stored_turn_over_the_limit_on_every_path(
    slack_db: OutboxTestDatabase, path: str
) -> None:
    request = store_turn(slack_db, "t1", "x" * (TEXT_LIMIT + 1))
    outbox = slack_db.outbox

    async def enqueue_async() -> None:
        async with await slack_db.aconnect() as conn:
            if path == "aenqueue":
                await outbox.aenqueue(conn, request)
            else:
                await outbox.aenqueue_many(conn, [request])

    def enqueue() -> None:
        if path.startswith("a"):
            asyncio.run(enqueue_async())
            return
        with slack_db.connect() as conn:
            if path == "enqueue":
                outbox.enqueue(conn, request)
            else:
                outbox.enqueue_many(conn, [request])

    with pytest.raises(InvalidRequest, match=LIMIT_MESSAGE):
        enqueue()

    assert slack_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


def test_the_kinds_enqueue_check_lets_a_stored_turn_within_the_limit_through(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    request = store_turn(slack_db, "t1", "x" * TEXT_LIMIT)
    with slack_db.connect() as conn:
        slack_db.outbox.enqueue(conn, request)

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.DONE, StopReason.COMPLETED, 1)


def test_a_turn_over_the_limit_that_reached_the_queue_is_never_posted(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    # Enqueued by a build without the check (a rolling update): the adapter refuses it.
    post(slack_db, "t1")
    slack_db.execute("UPDATE {schema}.slack_entry SET text = repeat('x', 40001)")

    slack_db.drain()

    assert action(slack_db, "t1") == (ActionState.FAILED, "SLACK_MSG_TOO_LONG", 1)
    assert slack_server.requests["chat.postMessage"] == 0
    assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == (
        "the message is 40,001 characters, Slack keeps 40,000: not posted"
    )


def test_a_post_slack_truncated_is_not_done_and_its_entries_get_no_message_reference(
    slack_db: OutboxTestDatabase, slack_server: SlackTestServer
) -> None:
    slack_server.truncate_text(at=10)  # a Slack that cuts sooner than it documents
    post(slack_db, "t1", count=3)

    slack_db.drain()

    [message] = slack_server.posts
    assert message.text == "text 0\n\nte"
    assert action(slack_db, "t1") == (ActionState.FAILED, "SLACK_MESSAGE_TRUNCATED", 1)
    assert slack_db.scalar("SELECT last_detail FROM {schema}.agent_action") == (
        f"Slack ok with warning message_truncated: message {message.ts} is not as sent"
    )
    assert slack_db.rows("SELECT message_ts FROM {schema}.slack_entry") == [(None,)] * 3
    assert slack_server.requests["chat.postMessage"] == 1


@pytest.mark.parametrize(
    ("warning", "state", "reason"),
    [
        ("missing_charset", ActionState.DONE, StopReason.COMPLETED),
        ("superfluous_charset", ActionState.DONE, StopReason.COMPLETED),
        ("message_truncated", ActionState.FAILED, "SLACK_MESSAGE_TRUNCATED"),
        ("some_new_warning", ActionState.FAILED, "SLACK_MESSAGE_ALTERED"),
        ("missing_charset,message_truncated", ActionState.FAILED, "SLACK_MESSAGE_TRUNCATED"),
    ],
)
def test_only_a_warning_about_the_requests_encoding_lets_a_post_be_done(
    slack_db: OutboxTestDatabase,
    slack_server: SlackTestServer,
    warning: str,
    state: ActionState,
    reason: str,
) -> None:
    slack_server.warn(warning)
    post(slack_db, "t1")

    slack_db.drain()

    assert action(slack_db, "t1") == (state, reason, 1)
    assert len(slack_server.posts) == 1


def test_the_loopback_server_keeps_40000_characters_and_warns_as_slack_does(
    slack_server: SlackTestServer,
) -> None:
    from slack_sdk import WebClient

    client = WebClient(token=slack_server.token, base_url=slack_server.base_url)
    answer = client.chat_postMessage(channel=CHANNEL, text="y" * (TEXT_LIMIT + 5))

    assert answer["ok"] is True
    assert answer["warning"] == "message_truncated"
    assert answer["response_metadata"]["warnings"] == ["message_truncated"]
    assert len(answer["message"]["text"]) == TEXT_LIMIT
    assert len(slack_server.posts[0].text) == TEXT_LIMIT
