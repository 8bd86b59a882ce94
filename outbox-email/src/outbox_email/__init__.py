"""outbox-email: the ``EMAIL`` kind of outbox, email notices sent over SMTP at most once.

Write an :class:`EmailNotice` per kind of email, register it with the
``outbox_register_email_notices`` hook, and enqueue with :func:`enqueue_email` in the
transaction that makes the change. :class:`EmailAdapter` sends it once that commits.
"""

from .adapter import EmailAdapter
from .enqueue import (
    EmailOptions,
    aenqueue_email,
    email_request,
    enqueue_email,
    enqueue_email_steps,
)
from .errors import InvalidMail, NoRecipient, UnknownNotice
from .message import message_id
from .notices import (
    EmailNotice,
    Mail,
    NoticeContext,
    NoticeRegistry,
    Unreachable,
    UnreachableReason,
)
from .settings import EmailSettings

__all__ = [
    "EmailAdapter",
    "EmailNotice",
    "EmailOptions",
    "EmailSettings",
    "InvalidMail",
    "Mail",
    "NoRecipient",
    "NoticeContext",
    "NoticeRegistry",
    "UnknownNotice",
    "Unreachable",
    "UnreachableReason",
    "aenqueue_email",
    "email_request",
    "enqueue_email",
    "enqueue_email_steps",
    "message_id",
]
