"""The message on the wire: its stable Message-ID, its headers and body, its DATA transfer."""

from __future__ import annotations

import email
import email.policy
import hashlib
from email.headerregistry import Address
from email.message import EmailMessage
from typing import Any

import pytest

from outbox_email import InvalidMail, Mail, message_id
from outbox_email.message import data_transfer, render

SENDER = Address("Outbox", "noreply", "example.test")


def _parse(raw: bytes) -> EmailMessage:
    return email.message_from_bytes(raw, policy=email.policy.default)


def test_the_message_id_depends_on_the_idempotency_key_only() -> None:
    digest = hashlib.sha256(b"welcome:ada").hexdigest()[:32]
    assert message_id("welcome:ada", "mail.example.test") == f"<{digest}@mail.example.test>"
    assert message_id("welcome:ada", "mail.example.test") == message_id(
        "welcome:ada", "mail.example.test"
    )
    assert message_id("welcome:bob", "mail.example.test") != message_id(
        "welcome:ada", "mail.example.test"
    )


def test_a_message_carries_the_adapters_headers_and_a_text_and_html_body() -> None:
    mail = Mail(
        to=["Zoë Ünal <zoe@example.test>", "bob@example.test"],
        subject="Grüße – your report",
        text="Hello\n",
        html="<p>Hello</p>",
        headers={"List-Unsubscribe": "<https://example.test/u>"},
        reply_to="help@example.test",
    )
    parsed = _parse(render(mail, sender=SENDER, message_id="<abc@example.test>"))

    assert parsed["Message-ID"] == "<abc@example.test>"
    assert parsed["Subject"] == "Grüße – your report"
    assert str(parsed["To"]) == "Zoë Ünal <zoe@example.test>, bob@example.test"
    assert str(parsed["From"]) == "Outbox <noreply@example.test>"
    assert str(parsed["Reply-To"]) == "help@example.test"
    assert parsed["Date"] is not None
    assert parsed.get_content_type() == "multipart/alternative"
    assert mail.recipients == ["zoe@example.test", "bob@example.test"]


def test_a_message_is_seven_bit_clean_on_the_wire() -> None:
    mail = Mail(to="a@example.test", subject="Ünïcode", text="Ünïcode body\n" * 3)
    raw = render(mail, sender=SENDER, message_id="<x@example.test>")
    assert max(raw) < 128
    assert _parse(raw).get_content().replace("\r\n", "\n") == "Ünïcode body\n" * 3


def test_the_data_transfer_doubles_leading_dots_and_ends_with_a_dot_line() -> None:
    assert data_transfer(b"a\n.b\r\n..c\rd") == b"a\r\n..b\r\n...c\r\nd\r\n.\r\n"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"to": []}, "at least one recipient"),
        ({"to": "nobody"}, "not an ASCII address"),
        ({"to": "a@example.test\r\nBcc: x@example.test"}, "line break"),
        ({"to": "zoë@example.test"}, "not an ASCII address"),
        ({"subject": "two\nlines"}, "single line"),
        ({"subject": " "}, "may not be empty"),
        ({"text": ""}, "plain-text body"),
        ({"headers": {"Bcc": "x@example.test"}}, "written by the adapter"),
        ({"headers": {"Message-ID": "<mine@example.test>"}}, "written by the adapter"),
        ({"headers": {"X-Tag": "a\r\nBcc: x@example.test"}}, "one line of text"),
        ({"headers": {"Bad Name": "x"}}, "not a header name"),
    ],
)
def test_a_mail_that_cannot_be_sent_is_refused_when_it_is_built(
    kwargs: dict[str, Any], message: str
) -> None:
    values: dict[str, Any] = {"to": "a@example.test", "subject": "Hi", "text": "Hello"}
    values.update(kwargs)
    with pytest.raises(InvalidMail, match=message):
        Mail(**values)


def test_duplicate_recipients_get_one_rcpt() -> None:
    mail = Mail(to=["a@example.test", "A <a@example.test>"], subject="Hi", text="Hello")
    assert mail.recipients == ["a@example.test"]


def test_long_lines_and_special_display_names_survive_the_wire() -> None:
    mail = Mail(
        to=['"Smith, John" <js@example.test>'],
        subject="A very long subject line that keeps going " * 5,
        text="x" * 2000 + "\nend\n",
    )
    raw = render(mail, sender=SENDER, message_id="<x@example.test>")
    parsed = _parse(raw)

    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    assert str(parsed["To"]) == '"Smith, John" <js@example.test>'
    assert parsed["Subject"] == mail.subject
    assert parsed.get_content().replace("\r\n", "\n") == "x" * 2000 + "\nend\n"
