"""One SMTP connection carries many messages, without bending the retry rules."""

from __future__ import annotations

import asyncio
import time

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_email import EmailAdapter
from outbox_email.testing import SmtpTestServer, serve_email

from .conftest import action, enqueue

DONE_FIRST = (ActionState.DONE, StopReason.COMPLETED, 1)


def test_many_emails_share_a_few_connections(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=2)
    for n in range(20):
        enqueue(outbox_db, f"k{n}")

    outbox_db.drain()

    assert outbox_db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'") == 20
    assert len(smtp_server.messages) == 20
    assert smtp_server.connections <= 2


def test_without_reuse_each_email_has_a_connection_of_its_own(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, reuse_connections=False)
    for n in range(5):
        enqueue(outbox_db, f"k{n}")

    outbox_db.drain()

    assert len(smtp_server.messages) == 5
    assert smtp_server.connections == 5


def test_a_connection_is_replaced_after_max_messages_per_connection(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=1, max_messages_per_connection=2)
    for n in range(5):
        enqueue(outbox_db, f"k{n}")

    outbox_db.drain()

    assert len(smtp_server.messages) == 5
    assert smtp_server.connections == 3


async def test_a_pooled_connection_the_relay_closes_at_mail_is_replaced_in_the_same_attempt(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=1)
    async with outbox_db.executor() as executor:
        enqueue(outbox_db, "first")
        await executor.drain()
        smtp_server.reply("mail", 421)  # the relay timed the idle session out
        enqueue(outbox_db, "second")
        await executor.drain()
        adapter = executor.adapter("EMAIL")
        assert isinstance(adapter, EmailAdapter)
        await adapter.aclose()

    assert action(outbox_db, "second") == DONE_FIRST
    assert len(smtp_server.messages) == 2
    assert smtp_server.connections == 2


async def test_a_pooled_connection_closed_while_idle_is_not_used(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=1)
    async with outbox_db.executor() as executor:
        enqueue(outbox_db, "first")
        await executor.drain()
        smtp_server.close_connections()
        await asyncio.sleep(0.05)
        enqueue(outbox_db, "second")
        await executor.drain()
        await executor.adapter("EMAIL").aclose()  # type: ignore[attr-defined]

    assert action(outbox_db, "second") == DONE_FIRST
    assert len(smtp_server.messages) == 2


async def test_a_4xx_at_mail_on_a_pooled_connection_is_a_retry_not_a_reconnect(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=1)
    async with outbox_db.executor() as executor:
        enqueue(outbox_db, "first")
        await executor.drain()
        smtp_server.reply("mail", 451)
        enqueue(outbox_db, "second")
        await executor.drain()
        await executor.adapter("EMAIL").aclose()  # type: ignore[attr-defined]

    assert action(outbox_db, "second") == (ActionState.ADMITTED, None, 1)
    assert smtp_server.connections == 1


async def test_a_dropped_content_on_a_pooled_connection_stays_uncertain(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=1, command_timeout_seconds=2.0)
    async with outbox_db.executor() as executor:
        enqueue(outbox_db, "first")
        await executor.drain()
        smtp_server.drop("content")
        enqueue(outbox_db, "second")
        await executor.drain()
        enqueue(outbox_db, "third")
        await executor.drain()
        await executor.adapter("EMAIL").aclose()  # type: ignore[attr-defined]

    assert action(outbox_db, "second") == (ActionState.UNCERTAIN, StopReason.WRITE_UNCONFIRMED, 1)
    assert action(outbox_db, "third") == DONE_FIRST
    assert [m.rcpt_tos for m in smtp_server.messages] == [("ada@example.test",)] * 3


async def test_closing_the_adapter_says_goodbye_on_every_idle_connection(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=3)
    async with outbox_db.executor() as executor:
        for n in range(6):
            enqueue(outbox_db, f"k{n}")
        await executor.drain()
        assert smtp_server.open_connections >= 1
        await executor.adapter("EMAIL").aclose()  # type: ignore[attr-defined]
        assert await _wait_closed(smtp_server), "the relay still sees an open connection"


def test_idle_connections_are_closed_when_the_event_loop_ends(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server)
    enqueue(outbox_db, "k")

    outbox_db.drain()  # its own event loop, ended when drain() returns

    deadline = asyncio.run(_wait_closed(smtp_server))
    assert deadline, "the relay still sees an open connection"


async def _wait_closed(server: SmtpTestServer, timeout: float = 30.0) -> bool:
    """Whether the relay sees every connection closed within ``timeout`` (the QUIT and the
    close reach it after the client is done: waited for, not assumed)."""
    deadline = time.monotonic() + timeout
    while server.open_connections != 0:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_the_executor_closes_the_pooled_connections_when_it_closes(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, max_connections=2)
    async with outbox_db.executor() as executor:
        for n in range(4):
            enqueue(outbox_db, f"k{n}")
        await executor.drain()
        assert smtp_server.open_connections >= 1

    assert await _wait_closed(smtp_server)
