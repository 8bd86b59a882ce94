"""An EMAIL whose payload names a notice that no module registered in this process is refused
in the words of the mistake (issue 31 item 9): which notices are registered, and the usual
cause, never the variants machinery's words or its placeholder (nor the payload's value: see
tests/security; enqueue_email, whose notice is an argument, names it)."""

from __future__ import annotations

import pytest

from outbox_core import ActionRequest, InvalidRequest
from outbox_core.testing import OutboxTestDatabase
from outbox_email import NoticeRegistry, UnknownNotice, enqueue_email
from outbox_email.testing import SmtpTestServer, serve_email


def _email_changed(db: OutboxTestDatabase) -> None:
    """The root README's request, through the core's enqueue."""
    with db.connect() as conn:
        db.outbox.enqueue(
            conn,
            ActionRequest(
                kind="EMAIL",
                lane_key="account:7",
                idempotency_key="email-changed:7:1",
                payload={"notice": "email_changed", "event": {"account_id": 7}},
            ),
        )


def _count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def test_an_unregistered_notice_through_the_core_names_the_registered_ones_and_the_cause(
    email_db: OutboxTestDatabase,
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        _email_changed(email_db)
    assert str(refused.value) == (
        "payload.notice: no notice 'email_changed' is registered for EMAIL; registered ones "
        "are account_welcome, admin_alert, welcome; is OUTBOX_APP_PLUGINS set in this process? "
        "(the modules that register them in code are loaded from it, beside the installed "
        "plugins)"
    )
    assert _count(email_db) == 0


def test_with_no_notice_registered_it_says_none_and_never_names_the_placeholder(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, notices=NoticeRegistry())
    with pytest.raises(InvalidRequest) as refused:
        _email_changed(outbox_db)
    message = str(refused.value)
    assert (
        "no notice 'email_changed' is registered for EMAIL; registered ones are none; " in message
    )
    assert "OUTBOX_APP_PLUGINS" in message
    assert "outbox_email:none" not in message and "variants" not in message
    assert _count(outbox_db) == 0


def test_enqueue_email_says_the_same(email_db: OutboxTestDatabase) -> None:
    with email_db.connect() as conn, pytest.raises(UnknownNotice) as refused:
        enqueue_email(conn, "email_changed", {}, idempotency_key="k", outbox=email_db.outbox)
    assert "no notice 'email_changed' is registered; registered ones are " in str(refused.value)
    assert "is OUTBOX_APP_PLUGINS set in this process?" in str(refused.value)
