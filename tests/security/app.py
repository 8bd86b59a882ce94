"""The test application of the security suites, registered as a plugin: one email notice whose
event has a field of each shape (strings, an optional one, a list, a closed set), so that the
``EMAIL`` kind has a variant to fill with the canary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from outbox_core import hookimpl
from outbox_email import EmailNotice, Mail, NoticeContext


class CanaryEvent(BaseModel):
    account_id: str
    display_name: str
    note: str | None = None
    tags: list[str] = []
    level: Literal["low", "high"] = "low"


class CanaryNotice(EmailNotice[CanaryEvent]):
    """The message carries every field of the event: the provider receives the canary, and no
    log record may repeat it."""

    name = "security_canary"
    event = CanaryEvent

    def prepare(self, event: CanaryEvent, context: NoticeContext) -> Mail:
        return Mail(
            to="Canary Reader <reader@example.test>",
            subject=f"For {event.display_name}",
            text=f"{event.account_id}: {event.note} {' '.join(event.tags)} ({event.level})\n",
        )


@hookimpl
def outbox_register_email_notices(register: Callable[[EmailNotice[Any]], None]) -> None:
    register(CanaryNotice())
