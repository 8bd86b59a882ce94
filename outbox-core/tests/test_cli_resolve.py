"""`outbox resolve` and `outbox retry` against a real database: --help, the changes with their
audit (surface cli, --by), --dry-run, the confirmation for more than one action, bad options."""

from __future__ import annotations

import asyncio

import pytest

from outbox_core.testing import OutboxTestDatabase

from .operator_support import (
    audits,
    ended_by_executor,
    failed_before_writing,
    fence_then_uncertain,
    row,
)
from .test_cli import noop_installed, outbox

__all__ = ["noop_installed"]  # the fixture, used by name below


@pytest.mark.parametrize("name", ["resolve", "retry"])
def test_resolve_and_retry_answer_help(name: str) -> None:
    result = outbox(None, name, "--help")
    assert result.exit_code == 0
    assert "--reason" in result.output and "--dry-run" in result.output
    assert "--yes" in result.output


def test_outbox_resolve_done_audits_the_cli_and_the_name_given(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = asyncio.run(ended_by_executor(db, fence_then_uncertain, "c1"))
    result = outbox(
        db, "resolve", str(action_id), "--done", "--ref", "m-1", "--reason", "seen", "--by", "ana"
    )
    assert result.exit_code == 0, result.output
    assert f"changed action {action_id} (TEST_SCRIPTED): UNCERTAIN -> DONE" in result.output
    assert row(db, action_id)[:3] == ("DONE", "RESOLVED_DONE", "m-1")
    assert audits(db, action_id)[0][:4] == ("ana", "resolve_done", "seen", "cli")


def test_outbox_resolve_refuses_an_action_that_is_not_uncertain_in_one_line(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = asyncio.run(ended_by_executor(db, failed_before_writing, "c2"))
    result = outbox(db, "resolve", str(action_id), "--not-done", "--reason", "x")
    assert result.exit_code == 1
    assert "only an UNCERTAIN action is resolved" in result.output
    assert audits(db, action_id) == []


def test_outbox_retry_dry_run_shows_the_new_key_and_changes_nothing(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = asyncio.run(ended_by_executor(db, failed_before_writing, "c3"))
    result = outbox(db, "retry", str(action_id), "--reason", "x", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would change" in result.output and "key c3#retry-1" in result.output
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 1
    done = outbox(db, "retry", str(action_id), "--reason", "fixed")
    assert done.exit_code == 0, done.output
    assert "run again as action" in done.output
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 2


def test_more_than_one_action_without_a_terminal_needs_yes(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    first = asyncio.run(ended_by_executor(db, failed_before_writing, "y1"))
    second = asyncio.run(ended_by_executor(db, failed_before_writing, "y2"))
    refused = outbox(db, "retry", str(first), str(second), "--reason", "x")
    assert refused.exit_code == 2 and "pass --yes" in refused.output
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 2
    confirmed = outbox(db, "retry", str(first), str(second), "--reason", "x", "--yes")
    assert confirmed.exit_code == 0, confirmed.output
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reason", "x"], "choose one of"),
        (["--done", "--not-done", "--reason", "x"], "choose one of"),
        (["--done", "--reason", "x"], "--done needs --ref"),
        (["--not-done", "--ref", "r", "--reason", "x"], "--ref goes with --done"),
        (["--not-done"], "Missing option '--reason'"),
    ],
)
def test_outbox_resolve_bad_options_are_one_line_and_change_nothing(
    db: OutboxTestDatabase, args: list[str], message: str
) -> None:
    result = outbox(db, "resolve", "1", *args)
    assert result.exit_code == 2
    assert message in result.output
