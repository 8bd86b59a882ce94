"""Corrections from a review of the adapter: a missing login, addresses built by the notice,
long header values, and more attempts than connections."""

from __future__ import annotations

from email.headerregistry import Address
from typing import Any

import pytest
from pydantic import BaseModel

from outbox_core import ActionState
from outbox_core.testing import OutboxTestDatabase
from outbox_email import EmailNotice, InvalidMail, Mail, NoticeContext, enqueue_email
from outbox_email.testing import SmtpTestServer, serve_email

from .conftest import action, enqueue


class Event(BaseModel):
    n: int = 0


def notice(name: str, mail: Any) -> EmailNotice[Event]:
    class Notice(EmailNotice[Event]):
        event = Event

        def prepare(self, event: Event, context: NoticeContext) -> Mail:
            return mail()

    Notice.name = name
    return Notice()


def test_a_relay_that_wants_a_login_it_did_not_get_is_retried_until_the_login_is_set(
    outbox_db: OutboxTestDatabase,
) -> None:
    """The relay answers MAIL with 530 when OUTBOX_EMAIL_USERNAME is unset: the operator's
    configuration, which a later attempt may find fixed (as a wrong password is)."""
    with SmtpTestServer(credentials=("mailer", "s3cret")) as server:
        serve_email(outbox_db, server, username=None, password=None)
        enqueue(outbox_db, "no-login")
        outbox_db.drain()
        assert action(outbox_db, "no-login") == (ActionState.ADMITTED, None, 1)
        assert server.messages == []
        serve_email(outbox_db, server)  # the operator sets the login
        outbox_db.drain()
        assert action(outbox_db, "no-login")[0] is ActionState.DONE
        assert len(server.messages) == 1


@pytest.mark.parametrize(
    "address",
    [Address("Jörg", "jörg", "example.test"), Address("", "a\tb", "example.test")],
    ids=["non-ascii", "control-character"],
)
def test_an_address_object_gets_the_checks_of_an_address_string(address: Address) -> None:
    with pytest.raises(InvalidMail, match=r"to\[0\]"):
        Mail(to=address, subject="Hi", text="Hello")
    with pytest.raises(InvalidMail, match="reply_to"):
        Mail(to="a@example.test", subject="Hi", text="Hello", reply_to=address)
    kept = Mail(to=Address("Ada", "ada", "example.test"), subject="Hi", text="Hello")
    assert kept.to == (Address("Ada", "ada", "example.test"),)


def test_an_address_object_that_smtp_cannot_carry_fails_the_email_before_any_send(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    """A notice that built an Address with a tab in it at prepare(): the email ended
    UNCERTAIN after MAIL, though no content was ever sent; it now fails as invalid."""
    checked = {"done": False}

    def mail() -> Mail:
        if not checked["done"]:  # valid when enqueued, invalid when sent
            checked["done"] = True
            return Mail(to="a@example.test", subject="Hi", text="Hello")
        return Mail(to=Address("", "a\tb", "example.test"), subject="Hi", text="Hello")

    serve_email(outbox_db, smtp_server, notices=[notice("tabbed", mail)])
    with outbox_db.connect() as conn:
        enqueue_email(conn, "tabbed", {"n": 1}, idempotency_key="k", outbox=outbox_db.outbox)
    outbox_db.drain()
    assert action(outbox_db, "k") == (ActionState.FAILED, "INVALID_MESSAGE", 1)
    assert smtp_server.mail_commands == 0 and smtp_server.messages == []


def test_a_header_value_too_long_for_one_line_is_refused_when_the_mail_is_built() -> None:
    token = "x" * 1200
    with pytest.raises(InvalidMail, match="List-Unsubscribe"):
        Mail(
            to="a@example.test",
            subject="Hi",
            text="Hello",
            headers={"List-Unsubscribe": f"<https://example.test/u?t={token}>"},
        )
    Mail(to="a@example.test", subject="Hi", text="Hello", headers={"X-Tag": "short value"})


def test_no_more_emails_run_at_once_than_there_are_connections(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    """The executor claimed up to its concurrency, but only max_connections can send: the
    others waited for a connection before their fence while their lease ran down, and were
    abandoned. The adapter now limits its kind to its connections. Scaled down: 4 s of lease
    before the fence margin, one connection, a relay that takes 1.5 s per email."""
    serve_email(
        outbox_db,
        smtp_server,
        max_connections=1,
        command_timeout_seconds=5.0,
        send_timeout_seconds=10.0,
    )
    smtp_server.stall("content", times=None, seconds=1.5)
    for n in range(6):
        enqueue(outbox_db, f"k{n}")
    outbox_db.drain(lease_seconds=64.0, fence_margin_seconds=60.0)
    assert [action(outbox_db, f"k{n}")[0] for n in range(6)] == [ActionState.DONE] * 6
    assert len(smtp_server.messages) == 6
