"""A small application for the tests: its people, and its email notices registered through the
``outbox_register_email_notices`` hook as an application plugin."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from pydantic import BaseModel

from outbox_core import hookimpl
from outbox_email import EmailNotice, Mail, NoticeContext, Unreachable, UnreachableReason


@dataclass
class Person:
    name: str
    email: str | None
    subscribed: bool = True
    roles: set[str] = field(default_factory=lambda: {"member"})


# The application's people, as the notices read them. Tests change it between attempts.
DIRECTORY: dict[str, Person] = {}
# Every stage at which a notice prepared a message: ("welcome", "enqueue"), ...
PREPARED: list[tuple[str, str]] = []
# The test database, for the notice that reads the application's own table at an attempt.
DATABASE: dict[str, str] = {}


def reset() -> None:
    DIRECTORY.clear()
    DIRECTORY["ada"] = Person("Ada Lovelace", "ada@example.test", roles={"member", "admin"})
    DIRECTORY["bob"] = Person("Bob", "bob@example.test")
    PREPARED.clear()
    DATABASE.clear()


class WelcomeEvent(BaseModel):
    account_id: str
    plan: Literal["free", "pro"] = "free"


class Welcome(EmailNotice[WelcomeEvent]):
    """To one account: needs an address and the subscription."""

    name = "welcome"
    event = WelcomeEvent

    def prepare(self, event: WelcomeEvent, context: NoticeContext) -> Mail | Unreachable:
        PREPARED.append((self.name, context.stage))
        person = DIRECTORY.get(event.account_id)
        if person is None:
            return Unreachable(UnreachableReason.NO_RECIPIENT, "the account is gone")
        if person.email is None:
            return Unreachable(UnreachableReason.NO_ADDRESS)
        if not person.subscribed:
            return Unreachable(UnreachableReason.UNSUBSCRIBED)
        return Mail(
            to=f"{person.name} <{person.email}>",
            subject=f"Welcome, {person.name}",
            text=f"Hello {person.name},\nyour {event.plan} plan is ready.\n.\n.a line with a dot\n",
            html=f"<p>Hello {person.name}, your <b>{event.plan}</b> plan is ready.</p>",
            headers={"List-Unsubscribe": "<https://example.test/unsubscribe>"},
        )


class Severity(enum.Enum):
    LOW = "low"
    HIGH = "high"


class AdminAlert(BaseModel):
    account_ids: list[str]
    severity: Severity


class AdminAlertNotice(EmailNotice[AdminAlert]):
    """To several admins at once; whoever lost the role is left out, nobody left: NOT_PERMITTED.
    Pure, so it runs inline instead of in a worker thread."""

    name = "admin_alert"
    event = AdminAlert

    def prepare(self, event: AdminAlert, context: NoticeContext) -> Mail | Unreachable:
        PREPARED.append((self.name, context.stage))
        admins = [
            DIRECTORY[account]
            for account in event.account_ids
            if account in DIRECTORY and "admin" in DIRECTORY[account].roles
        ]
        if not admins:
            return Unreachable(UnreachableReason.NOT_PERMITTED)
        addresses = [person.email for person in admins if person.email is not None]
        if not addresses:
            return Unreachable(UnreachableReason.NO_ADDRESS)
        return Mail(to=addresses, subject=f"Alert: {event.severity.value}", text="Look at it.")

    async def aprepare(self, event: AdminAlert, context: NoticeContext) -> Mail | Unreachable:
        return self.prepare(event, context)


class AccountCreated(BaseModel):
    account_id: int


class AccountWelcome(EmailNotice[AccountCreated]):
    """Reads the application's own table: at enqueue through the caller's connection (the
    account is not committed yet), at an attempt through a connection of its own."""

    name = "account_welcome"
    event = AccountCreated

    def prepare(self, event: AccountCreated, context: NoticeContext) -> Mail | Unreachable:
        PREPARED.append((self.name, context.stage))
        query = "SELECT email, opted_out FROM app_account WHERE id = %s"
        if context.connection is not None:
            row = context.connection.execute(query, (event.account_id,)).fetchone()
        else:
            with psycopg.connect(DATABASE["url"]) as conn:
                row = conn.execute(query, (event.account_id,)).fetchone()
        if row is None:
            return Unreachable(UnreachableReason.NO_RECIPIENT)
        if row[1]:
            return Unreachable(UnreachableReason.UNSUBSCRIBED)
        return Mail(to=row[0], subject="Your account is ready", text="Welcome aboard.")


class LaterEvent(BaseModel):
    account_id: str


class Later(EmailNotice[LaterEvent]):
    """A notice that only a newer build has (not registered by the plugin below)."""

    name = "later"
    event = LaterEvent

    def prepare(self, event: LaterEvent, context: NoticeContext) -> Mail | Unreachable:
        return Mail(to="later@example.test", subject="Later", text="From a newer build.")


@hookimpl
def outbox_register_email_notices(register: Any) -> None:
    register(Welcome())
    register(AdminAlertNotice())
    register(AccountWelcome())
