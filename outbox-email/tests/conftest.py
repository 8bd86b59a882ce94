from __future__ import annotations

from typing import Any

import pytest

from outbox_core import ActionState
from outbox_core.plugins import PluginHost, build_host
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.plugin_listed import plugin_listed_first
from outbox_email import enqueue_email
from outbox_email.testing import SmtpTestServer, serve_email

from . import notices

pytest_collection_modifyitems = plugin_listed_first
"""The plugin's first test runs first: `outbox plugins` lists it and its kinds."""


@pytest.fixture(scope="session")
def outbox_plugin_host() -> PluginHost:
    """The installed plugins plus this test application, which registers its notices through
    the hook like any application would."""
    return build_host(extra_plugins=[("email-tests", notices)])


@pytest.fixture(autouse=True)
def directory() -> dict[str, notices.Person]:
    notices.reset()
    return notices.DIRECTORY


@pytest.fixture
def email_db(outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer) -> OutboxTestDatabase:
    """A fresh database whose EMAIL kind sends to the loopback server (short timeouts: a
    stalled relay is given up on after 2 s, which a loopback reply on a busy machine meets)."""
    serve_email(outbox_db, smtp_server, connect_timeout_seconds=2.0, command_timeout_seconds=2.0)
    return outbox_db


def enqueue(
    db: OutboxTestDatabase, key: str, notice: str = "welcome", event: Any = None, **options: Any
) -> int:
    """Enqueue one email in a transaction of its own; its action id."""
    event = event if event is not None else {"account_id": "ada"}
    with db.connect() as conn:
        return enqueue_email(
            conn, notice, event, idempotency_key=key, outbox=db.outbox, **options
        ).id


def action(db: OutboxTestDatabase, key: str) -> tuple[ActionState, str | None, int]:
    """(state, stop reason, attempts counted) of the action holding ``key``."""
    found = db.action_state(key)
    assert found is not None, f"no action holds {key}"
    return found
