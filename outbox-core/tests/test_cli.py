"""The outbox command: every subcommand, and bad input that changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from outbox_core import ActionRequest
from outbox_core.cli import main
from outbox_core.migrations import core_line
from outbox_core.testing import OutboxTestDatabase


def outbox(db: OutboxTestDatabase | None, *args: str, env: dict[str, str] | None = None) -> Result:
    environment = {"OUTBOX_DATABASE_URL": db.url} if db is not None else {}
    environment.update(env or {})
    return CliRunner().invoke(main, list(args), env=environment, catch_exceptions=False)


def snapshot(db: OutboxTestDatabase) -> list[tuple[Any, ...]]:
    return db.rows("SELECT * FROM {schema}.agent_action ORDER BY id")


def enqueue(db: OutboxTestDatabase, key: str, **fields: Any) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", key, **fields)).id
        conn.commit()
    return action_id


@pytest.fixture
def noop_installed(monkeypatch: pytest.MonkeyPatch, db: OutboxTestDatabase) -> OutboxTestDatabase:
    """The CLI builds its Outbox from the installed plugins; give it this test's registry."""
    from outbox_core import outbox as outbox_module

    monkeypatch.setattr(outbox_module.Outbox, "registry", property(lambda self: db.registry))
    return db


def test_help_explains_the_configuration() -> None:
    result = outbox(None, "--help")
    assert result.exit_code == 0
    assert "OUTBOX_DATABASE_URL" in result.output and "quickstart" in result.output
    for command in (
        "migrate",
        "run",
        "run-now",
        "plugins",
        "status",
        "show",
        "cancel",
        "erase",
        "quickstart",
    ):
        sub = outbox(None, command, "--help")
        assert sub.exit_code == 0 and "OUTBOX_DATABASE_URL" in sub.output, command


def test_migrate_on_a_migrated_database_applies_nothing(db: OutboxTestDatabase) -> None:
    result = outbox(db, "migrate")
    assert result.exit_code == 0, result.output
    assert "nothing to apply" in result.output


def test_migrate_print_shows_pending_sql_only(db: OutboxTestDatabase) -> None:
    result = outbox(db, "migrate", "--print")
    assert result.exit_code == 0
    assert result.output == '-- outbox: nothing to apply; schema "outbox" is up to date\n'
    everything = outbox(db, "migrate", "--print", "--all")
    assert 'CREATE TABLE "outbox".agent_action' in everything.output


def test_plugins_reports_applied_migrations(db: OutboxTestDatabase) -> None:
    result = outbox(db, "plugins")
    core = next(
        p for p in json.loads(result.output)["plugins"] if p["distribution"] == "outbox-core"
    )
    shipped = [migration.version for migration in core_line().files()]
    assert shipped[:3] == [1, 2, 3]
    assert core["migrations"]["core"] == {"applied": shipped, "pending": []}


def test_status_show_cancel_and_erase(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    first = enqueue(db, "a", subject_account_id="person-1")
    second = enqueue(db, "b")
    status = json.loads(outbox(db, "status", "--json").output)
    # One lane: its head is due, the action behind it waits.
    counts = {k["kind"]: (k["due"], k["waiting"]) for k in status["kinds"]}
    assert counts["TEST_NOOP"] == (1, 1)
    assert "TEST_NOOP" in outbox(db, "status").output
    shown = json.loads(outbox(db, "show", str(second)).output)
    assert shown["state"] == "ADMITTED" and "payload" not in shown
    assert "payload" in json.loads(outbox(db, "show", str(second), "--payload").output)
    result = outbox(db, "cancel", str(second))
    assert result.exit_code == 0 and f"cancelled action {second}" in result.output
    erased = json.loads(outbox(db, "erase", "--subject", "person-1").output)
    assert erased["actions"] == 1
    assert db.rows("SELECT id, state FROM {schema}.agent_action") == [(second, "CANCELLED")]
    assert first not in [r[0] for r in db.rows("SELECT id FROM {schema}.agent_action")]


@pytest.mark.parametrize(
    ("args", "env", "message", "code"),
    [
        (["show", "999999"], None, "no action 999999", 1),
        (["cancel", "999999"], None, "no action 999999", 1),
        (["show", "not-a-number"], None, "'not-a-number' is not a valid integer", 2),
        (
            ["status"],
            {"OUTBOX_DATABASE_URL": "mysql://nope"},
            "OUTBOX_DATABASE_URL: expected a URL that starts with postgresql://",
            2,
        ),
        (
            ["--database-url", "mysql://nope", "status"],
            None,
            "configuration: --database-url: expected a URL that starts with postgresql://",
            2,
        ),
        (["--schema", "Bad-Name", "status"], None, "configuration: --schema: use a lower-case", 2),
        (
            ["status"],
            {"OUTBOX_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
            "cannot reach the database",
            1,
        ),
        (
            ["status"],
            {"OUTBOX_DATABASE_URL": "postgresql://user@[::1/db"},
            "OUTBOX_DATABASE_URL: malformed (end of string reached",
            2,
        ),
        (
            ["status"],
            {"OUTBOX_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/x?sslmode=bogus"},
            'invalid sslmode value: "bogus"',
            1,
        ),
        (
            ["status"],
            {"OUTBOX_SCHEMA": "Bad-Name"},
            "OUTBOX_SCHEMA: use a lower-case name",
            2,
        ),
        (["run", "--kinds", "NO_SUCH"], None, "--kinds: unknown NO_SUCH; installed kinds:", 2),
        (["erase"], None, "Missing option '--subject'", 2),
        (["--config", "/no/such.toml", "status"], None, "--config /no/such.toml: no such file", 2),
        (
            ["status", "--database-url", "mysql://nope"],
            None,
            "configuration: --database-url: expected a URL that starts with postgresql://",
            2,
        ),
        (["status", "--schema", "Bad-Name"], None, "configuration: --schema: use a lower-case", 2),
        (["status", "--config", "/no/such.toml"], None, "--config /no/such.toml: no such file", 2),
    ],
)
def test_bad_input_gets_a_clear_message_a_nonzero_exit_and_changes_nothing(
    db: OutboxTestDatabase, args: list[str], env: dict[str, str] | None, message: str, code: int
) -> None:
    enqueue(db, "untouched")
    before = snapshot(db)
    result = CliRunner().invoke(main, args, env={"OUTBOX_DATABASE_URL": db.url, **(env or {})})
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert snapshot(db) == before


def test_the_shared_options_work_after_the_command_as_before_it_and_after_wins(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    action_id = enqueue(db, "shown")
    before = outbox(None, "--database-url", db.url, "show", str(action_id))
    after = outbox(None, "show", str(action_id), "--database-url", db.url)
    assert before.exit_code == after.exit_code == 0, (before.output, after.output)
    assert json.loads(after.output)["id"] == json.loads(before.output)["id"] == action_id
    wrong_first = outbox(
        None,
        "--database-url",
        "postgresql://postgres@127.0.0.1:1/x",
        "show",
        str(action_id),
        "--database-url",
        db.url,
    )
    assert wrong_first.exit_code == 0, wrong_first.output
    assert "--database-url" in outbox(None, "status", "--help").output


def test_cancelling_a_started_action_is_refused(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    action_id = enqueue(db, "started")
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() + interval '1 min'"
    )
    before = snapshot(db)
    result = outbox(db, "cancel", str(action_id))
    assert result.exit_code == 1
    assert f"action {action_id} is EXECUTING: only an action that has not started" in result.output
    assert snapshot(db) == before


def test_cancelling_an_action_whose_write_started_is_refused(
    noop_installed: OutboxTestDatabase,
) -> None:
    """Admitted again by a deferral after a Reread, with its write started: the effect may
    exist, so it is read back, not cancelled."""
    db = noop_installed
    action_id = enqueue(db, "written")
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() + interval '1 min'"
    )
    db.execute(
        "UPDATE {schema}.agent_action SET write_started_at = now() WHERE id = %s", (action_id,)
    )
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'ADMITTED', lease_until = NULL WHERE id = %s",
        (action_id,),
    )
    before = snapshot(db)
    result = outbox(db, "cancel", str(action_id))
    assert result.exit_code == 1
    assert f"action {action_id} waits out a deferral after its write started" in result.output
    assert snapshot(db) == before


def test_no_database_configured_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["status"], env={"OUTBOX_DATABASE_URL": ""})
    assert result.exit_code == 2
    assert "no database configured: set OUTBOX_DATABASE_URL" in result.output


def test_run_stops_gracefully_on_sigterm(db: OutboxTestDatabase) -> None:
    env = {**os.environ, "OUTBOX_DATABASE_URL": db.url, "OUTBOX_SHUTDOWN_SECONDS": "5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox_core.cli", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until its LISTEN connection is up
            listening = db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
            )
            if listening:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the executor never started listening")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output


def test_run_exposes_metrics_for_prometheus(db: OutboxTestDatabase, tmp_path: Path) -> None:
    import socket
    import urllib.request

    from .test_plugins import GOOD_PLUGIN, install_fake_distribution

    # A plugin with a kind, so the backlog gauges have a series even with no plugin installed.
    install_fake_distribution(tmp_path, "outbox-fake", "outbox_fake_plugin", GOOD_PLUGIN)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": db.url,
        "OUTBOX_MAINTENANCE_SECONDS": "0.2",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox_core.cli", "run", "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 20, ""
        while time.monotonic() < deadline and 'action_backlog_due{kind="FAKE_KIND"' not in body:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=2
                ) as response:
                    body = response.read().decode()
            except OSError:
                pass
            time.sleep(0.1)
        assert 'action_backlog_due{kind="FAKE_KIND"' in body, body[:2000]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_plugins_bad_setting_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import Field, model_validator
    from pydantic_settings import SettingsConfigDict

    from outbox_core import ConfigurationError
    from outbox_core.settings_section import SectionSettings

    class Section(SectionSettings):
        model_config = SettingsConfigDict(env_prefix="OUTBOX_DEMO_", extra="ignore")
        port: int = Field(default=1, ge=1)
        tags: list[str] = Field(default_factory=list)

        @model_validator(mode="after")
        def _not_two(self) -> Section:
            if self.port == 2:
                raise ValueError("the port must not be 2")
            return self

    monkeypatch.setenv("OUTBOX_DEMO_PORT", "0")
    with pytest.raises(ConfigurationError, match="OUTBOX_DEMO_PORT: Input should be greater"):
        Section.load()
    monkeypatch.setenv("OUTBOX_DEMO_PORT", "2")
    with pytest.raises(ConfigurationError, match="^OUTBOX_DEMO: the port must not be 2$"):
        Section.load()
    monkeypatch.setenv("OUTBOX_DEMO_PORT", "3")
    monkeypatch.setenv("OUTBOX_DEMO_TAGS", "a")
    with pytest.raises(ConfigurationError, match="OUTBOX_DEMO_TAGS: cannot be parsed"):
        Section.load()


def test_run_now_carries_out_a_due_lane_head_at_once(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    action_id = enqueue(db, "head")
    result = outbox(db, "run-now", str(action_id))
    assert result.exit_code == 0, result.output
    assert f"ran action {action_id} (TEST_NOOP in lane lane): now DONE" in result.output
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"


def test_run_now_of_an_action_behind_its_lanes_head_is_refused_and_changes_nothing(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    enqueue(db, "head", not_before=datetime.now(UTC) + timedelta(hours=1))
    behind = enqueue(db, "behind")
    before = snapshot(db)
    result = outbox(db, "run-now", str(behind))
    assert result.exit_code == 1
    assert f"action {behind} is not the head of lane 'lane'" in result.output
    assert snapshot(db) == before


def test_run_now_of_an_ended_action_is_refused(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    action_id = enqueue(db, "head")
    assert outbox(db, "run-now", str(action_id)).exit_code == 0
    result = outbox(db, "run-now", str(action_id))
    assert result.exit_code == 1
    assert f"action {action_id} is DONE: only an admitted action can be run now" in result.output
