"""`outbox cancel` and `outbox run-now` write their audit row as resolve and retry do: who (the
name given, else the OS user), why (the reason given, else "no reason given"), from the CLI, the
state after; a refused one writes none."""

from __future__ import annotations

import getpass

from outbox_core.testing import OutboxTestDatabase

from .operator_support import audits
from .test_cli import enqueue, noop_installed, outbox

__all__ = ["noop_installed"]  # the fixture, used by name below


def test_cancel_is_audited_with_the_reason_and_name_given(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = enqueue(db, "c")
    result = outbox(db, "cancel", str(action_id), "--reason", "sent by hand", "--by", "ana")
    assert result.exit_code == 0, result.output
    assert audits(db, action_id) == [
        ("ana", "cancel", "sent by hand", "cli", None, "CANCELLED", None, None)
    ]


def test_run_now_is_audited_with_the_os_user_and_no_reason(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = enqueue(db, "r")
    result = outbox(db, "run-now", str(action_id))
    assert result.exit_code == 0, result.output
    assert audits(db, action_id) == [
        (getpass.getuser(), "run_now", "no reason given", "cli", "ADMITTED", "DONE", None, None)
    ]


def test_a_refused_cancel_or_run_now_writes_no_audit(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    action_id = enqueue(db, "x")
    assert outbox(db, "run-now", str(action_id)).exit_code == 0
    assert outbox(db, "cancel", str(action_id), "--reason", "late").exit_code == 1
    assert outbox(db, "run-now", str(action_id)).exit_code == 1
    assert [row[1] for row in audits(db, action_id)] == ["run_now"]


def test_a_blank_reason_is_a_one_line_error(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    action_id = enqueue(db, "b")
    result = outbox(db, "cancel", str(action_id), "--reason", "  ")
    assert result.exit_code != 0
    assert "reason: say why, or leave it out" in result.output
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "ADMITTED"
