"""The errors outbox-email raises on purpose. Each message says what was wrong and what to do."""

from __future__ import annotations

from outbox_core import InvalidRequest


class InvalidMail(ValueError):
    """A notice built a :class:`~outbox_email.Mail` that cannot be sent (no recipient, a
    malformed address, a line break in a header, a header the adapter owns)."""


class UnknownNotice(InvalidRequest):
    """No installed plugin registers an email notice of this name."""


class NoRecipient(InvalidRequest):
    """The notice says nobody can receive this email (``reason``: UNSUBSCRIBED, NO_ADDRESS,
    NOT_PERMITTED or NO_RECIPIENT); nothing was enqueued."""

    def __init__(self, field: str, message: str, reason: str) -> None:
        super().__init__(field, message)
        self.reason = reason
