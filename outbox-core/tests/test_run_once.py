"""`outbox run --once` (issue 31 item 6): what is due now runs, once, and the command exits;
nothing that is not due is made due (a not_before, a backoff, a deferral stay as they were)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner, Result

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Defer, Done, Retry
from outbox_core.cli import main
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, db: OutboxTestDatabase) -> OutboxTestDatabase:
    """The CLI builds its Outbox from the installed plugins; give it this test's registry."""
    from outbox_core import outbox as outbox_module

    monkeypatch.setattr(outbox_module.Outbox, "registry", property(lambda self: db.registry))
    return db


def run_once(db: OutboxTestDatabase, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["run", "--once", *args], env={"OUTBOX_DATABASE_URL": db.url}, catch_exceptions=False
    )


def enqueue(db: OutboxTestDatabase, lane: str, key: str, **fields: Any) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", lane, key, **fields)).id
        conn.commit()
    return action_id


def states(db: OutboxTestDatabase) -> dict[int, tuple[str, int, bool]]:
    """id: (state, attempt, due in the future)."""
    rows = db.rows("SELECT id, state, attempt, due_at > now() FROM {schema}.agent_action")
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


async def done(attempt: ActionAttempt) -> AdapterResult:
    return Done()


def test_run_once_runs_what_is_due_and_never_what_is_scheduled_ahead(
    installed: OutboxTestDatabase,
) -> None:
    db = installed
    ScriptedAdapter.script = done
    now = db.scalar("SELECT now()")
    due = enqueue(db, "a", "due")
    next_in_lane = enqueue(db, "a", "next")  # due once the head before it ends
    tomorrow = enqueue(db, "b", "tomorrow", not_before=now + timedelta(days=1))
    behind = enqueue(db, "b", "behind")  # behind a head scheduled ahead: not due
    due_at = db.scalar("SELECT due_at FROM {schema}.agent_action WHERE id = %s", (tomorrow,))

    result = run_once(db)

    assert result.exit_code == 0, result.output
    assert states(db) == {
        due: ("DONE", 1, False),
        next_in_lane: ("DONE", 1, False),
        tomorrow: ("ADMITTED", 0, True),
        behind: ("ADMITTED", 0, False),
    }
    assert db.scalar("SELECT due_at FROM {schema}.agent_action WHERE id = %s", (tomorrow,)) == (
        due_at
    )
    assert result.stdout.splitlines()[-1] == (
        "ran what was due: claimed 2, done 2, failed 0, cancelled 0, uncertain 0, "
        "rescheduled 0; nothing it serves was due at its last look"
    )


@pytest.mark.parametrize(
    "result",
    [Retry(after=timedelta(hours=1)), Defer(after=timedelta(hours=1))],
    ids=lambda result: type(result).__name__,
)
def test_run_once_never_advances_a_backoff_or_a_deferral(
    installed: OutboxTestDatabase, result: AdapterResult
) -> None:
    db = installed

    async def later(attempt: ActionAttempt) -> AdapterResult:
        return result

    ScriptedAdapter.script = later
    action_id = enqueue(db, "a", "later")
    first = run_once(db)
    assert first.exit_code == 0, first.output
    attempt = 0 if isinstance(result, Defer) else 1
    assert states(db) == {action_id: ("ADMITTED", attempt, True)}
    due_at = db.scalar("SELECT due_at FROM {schema}.agent_action WHERE id = %s", (action_id,))

    second = run_once(db)

    assert second.exit_code == 0, second.output
    assert len(ScriptedAdapter.calls) == 1
    assert states(db) == {action_id: ("ADMITTED", attempt, True)}
    assert db.scalar("SELECT due_at FROM {schema}.agent_action WHERE id = %s", (action_id,)) == (
        due_at
    )
    assert "claimed 0," in second.stdout


def test_run_once_with_nothing_due_exits_zero_at_once(installed: OutboxTestDatabase) -> None:
    result = run_once(installed)
    assert result.exit_code == 0, result.output
    assert "claimed 0, done 0," in result.stdout


def test_run_once_with_a_kind_stopped_exits_2_naming_it(
    installed: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind whose adapter cannot be built leaves its due actions due: not a clean exit."""
    from outbox_core import ConfigurationError

    def broken(cls: type[ScriptedAdapter], settings: Any) -> ScriptedAdapter:
        raise ConfigurationError("OUTBOX_TEST_TOKEN: missing")

    monkeypatch.setattr(ScriptedAdapter, "build", classmethod(broken))
    action_id = enqueue(installed, "a", "due")

    result = run_once(installed)

    assert result.exit_code == 2, result.output
    assert "TEST_SCRIPTED" in result.stderr.splitlines()[-1]
    assert "still due" in result.stderr.splitlines()[-1]
    assert states(installed) == {action_id: ("ADMITTED", 0, False)}
