"""The adapter retries only what the relay provably did not accept.

One table, every row against the real SMTP server on loopback: the fault, the state, stop
reason and attempts after the first drain, the same after a second drain (the fault is gone by
then), and how many messages the relay received: never two for one action.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_email.testing import SmtpTestServer, serve_email

from .conftest import action, enqueue

ADMITTED, DONE, FAILED, UNCERTAIN = (
    ActionState.ADMITTED,
    ActionState.DONE,
    ActionState.FAILED,
    ActionState.UNCERTAIN,
)
RETRIED = (ADMITTED, None, 1)
SENT_ON_SECOND = (DONE, StopReason.COMPLETED, 2)


@dataclass(frozen=True)
class Row:
    fault: Callable[[SmtpTestServer], None]
    first: tuple[ActionState, str | None, int]
    final: tuple[ActionState, str | None, int]
    received: int
    refused: int = 0


TABLE: dict[str, Row] = {
    # Before the transaction: the connection, the greeting, EHLO. Nothing was sent.
    "connection closed before the greeting": Row(
        lambda s: s.refuse_connections(), RETRIED, SENT_ON_SECOND, 1
    ),
    "greeting 421": Row(lambda s: s.reply("connect", 421), RETRIED, SENT_ON_SECOND, 1),
    "greeting 554": Row(lambda s: s.reply("connect", 554), RETRIED, SENT_ON_SECOND, 1),
    "no greeting in time": Row(lambda s: s.stall("connect"), RETRIED, SENT_ON_SECOND, 1),
    "EHLO 421": Row(lambda s: s.reply("ehlo", 421), RETRIED, SENT_ON_SECOND, 1),
    # MAIL, RCPT, DATA: a 4xx or a lost connection proves nothing was accepted; 5xx refuses.
    "MAIL 451": Row(lambda s: s.reply("mail", 451), RETRIED, SENT_ON_SECOND, 1),
    "MAIL 421": Row(lambda s: s.reply("mail", 421), RETRIED, SENT_ON_SECOND, 1),
    "MAIL dropped": Row(lambda s: s.drop("mail"), RETRIED, SENT_ON_SECOND, 1),
    "MAIL stalled": Row(lambda s: s.stall("mail"), RETRIED, SENT_ON_SECOND, 1),
    # A 5xx to MAIL refuses the sender (a login the relay wants, a sender it does not take):
    # configuration, retried; 552 and 555 refuse this email (its size, its parameters).
    "MAIL 530": Row(lambda s: s.reply("mail", 530), RETRIED, SENT_ON_SECOND, 1),
    "MAIL 550": Row(lambda s: s.reply("mail", 550), RETRIED, SENT_ON_SECOND, 1),
    "MAIL 553": Row(lambda s: s.reply("mail", 553), RETRIED, SENT_ON_SECOND, 1),
    "MAIL 552": Row(
        lambda s: s.reply("mail", 552), (FAILED, "SMTP_552", 1), (FAILED, "SMTP_552", 1), 0
    ),
    "RCPT 450": Row(lambda s: s.reply("rcpt", 450), RETRIED, SENT_ON_SECOND, 1),
    "RCPT 451": Row(lambda s: s.reply("rcpt", 451), RETRIED, SENT_ON_SECOND, 1),
    "RCPT 452": Row(lambda s: s.reply("rcpt", 452), RETRIED, SENT_ON_SECOND, 1),
    "RCPT dropped": Row(lambda s: s.drop("rcpt"), RETRIED, SENT_ON_SECOND, 1),
    "RCPT 550": Row(
        lambda s: s.reply("rcpt", 550), (FAILED, "SMTP_550", 1), (FAILED, "SMTP_550", 1), 0
    ),
    "DATA 451": Row(lambda s: s.reply("data", 451), RETRIED, SENT_ON_SECOND, 1),
    "DATA 421": Row(lambda s: s.reply("data", 421), RETRIED, SENT_ON_SECOND, 1),
    "DATA dropped": Row(lambda s: s.drop("data"), RETRIED, SENT_ON_SECOND, 1),
    "DATA stalled": Row(lambda s: s.stall("data"), RETRIED, SENT_ON_SECOND, 1),
    "DATA 554": Row(
        lambda s: s.reply("data", 554), (FAILED, "SMTP_554", 1), (FAILED, "SMTP_554", 1), 0
    ),
    # The final reply to the content: 4xx says the relay did not take it, 5xx refuses it,
    # and no reply at all leaves the email uncertain: it is never sent again.
    "content 451": Row(lambda s: s.reply("content", 451), RETRIED, SENT_ON_SECOND, 1, 1),
    "content 421": Row(lambda s: s.reply("content", 421), RETRIED, SENT_ON_SECOND, 1, 1),
    "content 550": Row(
        lambda s: s.reply("content", 550), (FAILED, "SMTP_550", 1), (FAILED, "SMTP_550", 1), 0, 1
    ),
    "content 552": Row(
        lambda s: s.reply("content", 552), (FAILED, "SMTP_552", 1), (FAILED, "SMTP_552", 1), 0, 1
    ),
    "connection dropped after the content": Row(
        lambda s: s.drop("content"),
        (UNCERTAIN, StopReason.WRITE_UNCONFIRMED, 1),
        (UNCERTAIN, StopReason.WRITE_UNCONFIRMED, 1),
        1,
    ),
    "no final reply in time": Row(
        lambda s: s.stall("content"),
        (UNCERTAIN, StopReason.WRITE_UNCONFIRMED, 1),
        (UNCERTAIN, StopReason.WRITE_UNCONFIRMED, 1),
        1,
    ),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_each_smtp_failure_ends_as_the_table_says_and_never_sends_twice(
    case: str, email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    row = TABLE[case]
    row.fault(smtp_server)
    enqueue(email_db, "k")

    email_db.drain()
    assert action(email_db, "k") == row.first

    smtp_server.clear_faults()
    email_db.drain()
    assert action(email_db, "k") == row.final
    assert len(smtp_server.messages) == row.received
    assert len(smtp_server.refused) == row.refused


@pytest.mark.parametrize("case", [name for name, row in TABLE.items() if row.first == RETRIED])
def test_a_retried_failure_at_the_last_attempt_ends_failed_with_attempts_exhausted(
    case: str, email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    TABLE[case].fault(smtp_server)
    enqueue(email_db, "k", max_attempts=1)

    email_db.drain()

    assert action(email_db, "k") == (FAILED, StopReason.ATTEMPTS_EXHAUSTED, 1)
    assert smtp_server.messages == []


def test_a_relay_that_refuses_tcp_connections_is_retried(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    serve_email(outbox_db, smtp_server, port=closed_port)
    enqueue(outbox_db, "k", max_attempts=2)

    outbox_db.drain()
    assert action(outbox_db, "k") == RETRIED
    outbox_db.drain()
    assert action(outbox_db, "k") == (FAILED, StopReason.ATTEMPTS_EXHAUSTED, 2)
    assert smtp_server.connections == 0


def test_the_message_id_is_identical_across_a_retry(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    smtp_server.reply("content", 451)
    enqueue(email_db, "welcome:ada:1")

    email_db.drain()
    email_db.drain()

    [refused] = smtp_server.refused
    [accepted] = smtp_server.messages
    assert refused.message_id == accepted.message_id
    assert accepted.message_id is not None and accepted.message_id.startswith("<")
    assert action(email_db, "welcome:ada:1") == SENT_ON_SECOND


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda people: setattr(people["ada"], "subscribed", False), "UNSUBSCRIBED"),
        (lambda people: setattr(people["ada"], "email", None), "NO_ADDRESS"),
        (lambda people: people.pop("ada"), "NO_RECIPIENT"),
    ],
    ids=["unsubscribed", "lost the address", "account gone"],
)
def test_a_recipient_who_drops_out_between_a_451_and_the_retry_receives_nothing(
    change: Callable[[dict[str, object]], object],
    reason: str,
    email_db: OutboxTestDatabase,
    smtp_server: SmtpTestServer,
    directory: dict[str, object],
) -> None:
    smtp_server.reply("rcpt", 451)
    enqueue(email_db, "welcome:ada")
    email_db.drain()
    assert action(email_db, "welcome:ada") == RETRIED

    change(directory)
    email_db.drain()

    assert action(email_db, "welcome:ada") == (FAILED, reason, 2)
    assert smtp_server.messages == [] and smtp_server.refused == []
    assert smtp_server.mail_commands == 1  # the first attempt's; the second never began one


def test_an_admin_who_lost_the_role_before_the_retry_is_not_sent_the_alert(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer, directory: dict[str, object]
) -> None:
    smtp_server.reply("content", 451)
    enqueue(email_db, "alert:1", "admin_alert", {"account_ids": ["ada"], "severity": "high"})
    email_db.drain()

    directory["ada"].roles.discard("admin")  # type: ignore[attr-defined]
    email_db.drain()

    assert action(email_db, "alert:1") == (FAILED, "NOT_PERMITTED", 2)
    assert smtp_server.messages == []


def test_a_failed_login_is_retried_and_a_fixed_one_sends(
    outbox_db: OutboxTestDatabase,
) -> None:
    with SmtpTestServer(credentials=("mailer", "s3cret")) as server:
        serve_email(outbox_db, server, password="wrong")
        enqueue(outbox_db, "k")
        outbox_db.drain()
        assert action(outbox_db, "k") == RETRIED
        assert server.mail_commands == 0

        serve_email(outbox_db, server)
        outbox_db.drain()
        assert action(outbox_db, "k") == SENT_ON_SECOND
        assert len(server.messages) == 1


@pytest.mark.parametrize("code", [454, 535])
def test_an_auth_refusal_is_retried_whatever_its_code(
    code: int, outbox_db: OutboxTestDatabase
) -> None:
    with SmtpTestServer(credentials=("mailer", "s3cret")) as server:
        serve_email(outbox_db, server)
        server.reply("auth", code)
        enqueue(outbox_db, "k")

        outbox_db.drain()
        assert action(outbox_db, "k") == RETRIED
        outbox_db.drain()
        assert action(outbox_db, "k") == SENT_ON_SECOND
        assert len(server.messages) == 1


def test_an_unconfigured_sender_fails_the_email_with_not_configured(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, sender=None)
    enqueue(outbox_db, "k")

    outbox_db.drain()

    assert action(outbox_db, "k") == (FAILED, StopReason.NOT_CONFIGURED, 1)
    assert smtp_server.connections == 0


def test_a_refused_fence_sends_nothing(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    enqueue(email_db, "k")

    # A lease of 61 s with a margin of 60.999 s: begin_write() refuses at once, for the margin.
    # The action is given back uncounted, refused again on the next run, and that attempt
    # counts (a Retry before the write): it waits, its first attempt spent, nothing sent.
    email_db.drain(lease_seconds=61.0, fence_margin_seconds=60.999)

    state, reason, attempts = action(email_db, "k")
    assert (state, reason, attempts) == (ActionState.ADMITTED, None, 1)
    assert email_db.scalar("SELECT write_started_at FROM {schema}.agent_action") is None
    assert smtp_server.mail_commands == 0
    assert smtp_server.messages == []
