"""EMAIL settings that cannot run with the core's stop EMAIL, not the executor's other kinds."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionState,
    ActionVariants,
    AdapterResult,
    ConfigurationError,
    Done,
)
from outbox_core.status import collect_status
from outbox_core.testing import OutboxTestDatabase
from outbox_email.testing import SmtpTestServer, serve_email

from .conftest import action, enqueue


class Note(BaseModel):
    text: str = ""


class NoteAdapter(ActionAdapter):
    """Another kind served by the same executor."""

    kind = "TEST_NOTE"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Note)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


@pytest.fixture
def below_margin(email_db: OutboxTestDatabase, smtp_server: SmtpTestServer) -> OutboxTestDatabase:
    """The default send timeout (45 s) is not below a fence margin of 30 s."""
    serve_email(email_db, smtp_server, send_timeout_seconds=45.0)
    email_db.register_kind(NoteAdapter)
    email_db.configure(fence_margin_seconds=30.0, strict_startup=False)
    enqueue(email_db, "welcome:ada")
    with email_db.connect() as conn:
        email_db.outbox.enqueue(conn, ActionRequest("TEST_NOTE", "notes", "note-1"))
        conn.commit()
    return email_db


async def test_email_settings_invalid_against_the_fence_margin_stop_only_email(
    below_margin: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    async with below_margin.executor() as executor:
        await executor.drain()
        # Only EMAIL of the kinds this test serves: another installed plugin whose defaults
        # also fail a 30 s margin (outbox-draft's, in a venv with every package) stops too.
        stopped = {kind.kind: kind.error for kind in executor.stopped}
        assert "EMAIL" in stopped and "TEST_NOTE" not in stopped
        assert "OUTBOX_EMAIL_SEND_TIMEOUT_SECONDS" in stopped["EMAIL"]
        assert executor.rt.instruments.stopped["EMAIL"] == 1
    assert action(below_margin, "welcome:ada") == (ActionState.ADMITTED, None, 0)
    note = below_margin.scalar(
        "SELECT state FROM {schema}.agent_action WHERE idempotency_key = 'note-1'"
    )
    assert note == "DONE"
    assert smtp_server.messages == []
    with below_margin.connect() as conn:
        report = collect_status(conn, below_margin.outbox)
    assert {kind.kind for kind in report.stopped} == set(stopped)


async def test_strict_start_up_refuses_email_settings_invalid_against_the_fence_margin(
    below_margin: OutboxTestDatabase,
) -> None:
    executor = below_margin.executor(strict_startup=True)
    with pytest.raises(
        ConfigurationError,
        match=r"strict start-up: .*EMAIL .*OUTBOX_EMAIL_SEND_TIMEOUT_SECONDS \(45\.0\) must be "
        r"below the fence margin \(30\.0 s\)",
    ):
        await executor.open()


async def test_invalid_email_settings_in_the_environment_stop_only_email_and_show_no_secret(
    outbox_db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_EMAIL_PORT", "99999")
    monkeypatch.setenv("OUTBOX_EMAIL_PASSWORD", "hunter2-secret")  # and no username
    outbox_db.register_kind(NoteAdapter)
    outbox_db.configure(strict_startup=False)
    with outbox_db.connect() as conn:
        outbox_db.outbox.enqueue(conn, ActionRequest("TEST_NOTE", "notes", "note-1"))
        conn.commit()
    async with outbox_db.executor() as executor:
        await executor.drain()
        [stopped] = executor.stopped
    assert stopped.kind == "EMAIL"
    assert "OUTBOX_EMAIL_PORT" in stopped.error and "99999" not in stopped.error
    assert "hunter2" not in stopped.error
    assert outbox_db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"


def test_outbox_run_strict_refuses_email_settings_invalid_against_the_fence_margin(
    outbox_db: OutboxTestDatabase,
) -> None:
    env = {**os.environ, "OUTBOX_DATABASE_URL": outbox_db.url, "OUTBOX_FENCE_MARGIN_SECONDS": "30"}
    completed = subprocess.run(  # its own process: `outbox run` tunes the garbage collector
        [sys.executable, "-m", "outbox_core.cli", "run", "--strict"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr  # a setting is wrong: as for the core's
    # EMAIL among them (another installed plugin's defaults may fail a 30 s margin too).
    assert re.search(
        r"strict start-up: \d kind\(s\) cannot run with these settings: .*\bEMAIL \(from outbox-email\)",
        completed.stderr,
    ), completed.stderr
    assert "OUTBOX_EMAIL_SEND_TIMEOUT_SECONDS (45.0) must be below the fence margin" in (
        completed.stderr
    )
