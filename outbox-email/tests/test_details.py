"""What each attempt leaves on the action as its detail: the relay's codes and the stage, never
an address, a name or the message (``outbox show`` and ``outbox status`` print it)."""

from __future__ import annotations

import re

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_email.adapter import smtp_detail
from outbox_email.testing import SmtpTestServer

from .conftest import enqueue
from .test_failure_modes import TABLE

# The recipient of every test email (tests/notices.py), and the sender's address.
PERSON = ("ada@example.test", "Ada", "Lovelace")


def detail(db: OutboxTestDatabase, key: str) -> tuple[str | None, str | None]:
    row = db.rows(
        "SELECT last_result, last_detail FROM {schema}.agent_action WHERE idempotency_key = %s",
        (key,),
    )[0]
    return row[0], row[1]


@pytest.mark.parametrize("case", list(TABLE))
def test_each_smtp_failure_keeps_its_code_and_stage_and_nothing_of_the_person(
    case: str, email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    TABLE[case].fault(smtp_server)
    enqueue(email_db, "k")
    email_db.drain()
    _, text = detail(email_db, "k")
    assert text, case
    code = re.search(r"\b([245]\d\d)\b", case)
    if code is not None:
        assert f"SMTP {code.group(1)}" in text, (case, text)
    stage = case.split()[0].lower()
    if stage in ("mail", "rcpt", "data", "content") and code is not None:
        assert f"at {stage}" in text, (case, text)
    assert not any(word.lower() in text.lower() for word in PERSON), text
    assert "@" not in text


def test_a_reply_that_quotes_the_recipient_leaves_only_its_codes(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    smtp_server.reply(
        "rcpt", 550, text="5.1.1 <ada@example.test>: Recipient address rejected: no Ada Lovelace"
    )
    smtp_server.reply("mail", 451, text="4.7.1 <ada@example.test> greylisted")
    enqueue(email_db, "k")
    email_db.drain()
    assert detail(email_db, "k") == ("Retry", "SMTP 451 4.7.1 at mail")
    email_db.drain()
    assert detail(email_db, "k") == ("Failed", "SMTP 550 5.1.1 at rcpt")


def test_a_sent_email_keeps_the_relays_answer(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    enqueue(email_db, "k")
    email_db.drain()
    result, text = detail(email_db, "k")
    assert result == "Done" and text is not None and text.startswith("SMTP 250")


@pytest.mark.parametrize(
    ("code", "message", "stage", "expected"),
    [
        (451, "4.7.1 try later", "rcpt", "SMTP 451 4.7.1 at rcpt"),
        (550, "<a@b.example> unknown", "rcpt", "SMTP 550 at rcpt"),
        (454, "4.7.0 TLS not available", None, "SMTP 454 4.7.0"),
        (250, b"2.0.0 bytes are not read", None, "SMTP 250"),
        (None, None, "connect", "SMTP reply at connect"),
        (550, "5.1.1<a@b.example>", None, "SMTP 550"),
    ],
)
def test_an_smtp_detail_keeps_the_codes_and_drops_the_text(
    code: int | None, message: object, stage: str | None, expected: str
) -> None:
    assert smtp_detail(code, message, stage=stage) == expected
