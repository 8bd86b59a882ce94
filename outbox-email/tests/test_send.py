"""An email enqueued in the application's transaction reaches the relay once it commits."""

from __future__ import annotations

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_email import message_id
from outbox_email.testing import SmtpTestServer

from .conftest import action, enqueue


def test_an_email_to_an_account_is_sent_once_with_its_stable_message_id(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    enqueue(email_db, "welcome:ada", event={"account_id": "ada", "plan": "pro"})

    assert email_db.drain() == 1

    assert action(email_db, "welcome:ada") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [received] = smtp_server.messages
    expected_id = message_id("welcome:ada", "outbox.example.test")
    assert received.message_id == expected_id
    assert (
        email_db.scalar(
            "SELECT readback_ref FROM {schema}.agent_action WHERE idempotency_key = 'welcome:ada'"
        )
        == expected_id
    )
    assert received.mail_from == "outbox@example.test"
    assert received.rcpt_tos == ("ada@example.test",)
    assert received.subject == "Welcome, Ada Lovelace"
    assert str(received.message["To"]) == "Ada Lovelace <ada@example.test>"
    assert str(received.message["From"]) == "Outbox Test <outbox@example.test>"
    assert received.message["List-Unsubscribe"] == "<https://example.test/unsubscribe>"
    assert received.text == "Hello Ada Lovelace,\nyour pro plan is ready.\n.\n.a line with a dot\n"
    assert received.html is not None and "<b>pro</b>" in received.html
