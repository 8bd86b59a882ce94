"""From a prepared :class:`~outbox_email.Mail` to the bytes of one SMTP DATA transfer."""

from __future__ import annotations

import email.charset
import email.policy
import email.utils
import hashlib
import re
from datetime import datetime
from email.header import Header
from email.headerregistry import Address
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from typing import cast

from .notices import Mail

# Built with the classic MIME classes and compat32 folding: about five times faster than
# EmailMessage.set_content with the modern policy, which parses every header it is given
# (the benchmark spent most of its time there). CRLF line ends; every part is 7-bit clean
# (ASCII, or quoted-printable UTF-8), so the relay needs neither 8BITMIME nor SMTPUTF8.
POLICY = email.policy.compat32.clone(linesep="\r\n")
_UTF8 = email.charset.Charset("utf-8")
_UTF8.body_encoding = email.charset.QP
_LONGEST_PLAIN_LINE = 900  # below SMTP's 998: longer lines go quoted-printable
_LINE_ENDS = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)


def message_id(idempotency_key: str, domain: str) -> str:
    """The email's Message-ID: derived from the idempotency key only, so it is the same on
    every attempt and every replica (a recipient's client shows a repeat as one message)."""
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def render(mail: Mail, *, sender: Address, message_id: str, date: datetime | None = None) -> bytes:
    """The RFC 5322 message: From, To, Subject, Date, Message-ID, the notice's headers, and a
    text body (multipart/alternative with the HTML when there is one)."""
    message: Message
    if mail.html is None:
        message = _part(mail.text, "plain")
    else:
        message = MIMEMultipart("alternative", policy=POLICY)
        message.attach(_part(mail.text, "plain"))
        message.attach(_part(mail.html, "html"))
    message["Message-ID"] = message_id
    message["Date"] = email.utils.format_datetime(date) if date else email.utils.formatdate()
    message["From"] = _address(sender)
    message["To"] = ", ".join(_address(address) for address in mail.to)
    if mail.reply_to is not None:
        message["Reply-To"] = _address(mail.reply_to)
    subject = Header(mail.subject, "us-ascii" if mail.subject.isascii() else "utf-8")
    message["Subject"] = cast(str, subject)
    for name, value in mail.headers.items():
        # typeshed types header values as str; Message also takes a Header (folded on output).
        message[name] = value if value.isascii() else cast(str, Header(value, "utf-8"))
    return message.as_bytes(policy=POLICY)


def data_transfer(message: bytes) -> bytes:
    """What follows the relay's 354: CRLF line ends, a leading dot doubled (RFC 5321 4.5.2),
    and the terminating ``.`` line."""
    text = _LINE_ENDS.sub(b"\r\n", message)
    if not text.endswith(b"\r\n"):
        text += b"\r\n"
    return _LEADING_DOT.sub(b"..", text) + b".\r\n"


def _part(body: str, subtype: str) -> MIMENonMultipart:
    plain = body.isascii() and all(len(line) <= _LONGEST_PLAIN_LINE for line in body.splitlines())
    part = MIMENonMultipart("text", subtype, policy=POLICY)
    part.set_payload(body, "us-ascii" if plain else _UTF8)
    return part


def _address(address: Address) -> str:
    return email.utils.formataddr((address.display_name, address.addr_spec), charset="utf-8")
