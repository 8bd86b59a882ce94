"""OUTBOX_APP_PLUGINS: an application's modules that register kinds in code reach every default
path (the default outbox, the executor, and the CLI's migrate, plugins, status and run)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import outbox_core
from outbox_core import (
    ActionRequest,
    ActionState,
    Executor,
    Outbox,
    OutboxSettings,
    PluginLoadError,
    load_plugins,
)
from outbox_core import outbox as outbox_module
from outbox_core.cli import main
from outbox_core.plugins import forget_loaded_plugins
from outbox_core.testing import OutboxTestDatabase

from .app_plugin import KIND

APP = "tests.app_plugin"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # where `tests` is importable from


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """OUTBOX_APP_PLUGINS names the test application's module; a fresh default outbox."""
    monkeypatch.setenv("OUTBOX_APP_PLUGINS", APP)
    monkeypatch.delenv("OUTBOX_PLUGINS", raising=False)
    monkeypatch.delenv("OUTBOX_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(outbox_module, "_default", None)
    forget_loaded_plugins()
    yield
    forget_loaded_plugins()


def outbox(db: OutboxTestDatabase, *args: str) -> Result:
    env = {"OUTBOX_DATABASE_URL": db.url, "OUTBOX_APP_PLUGINS": APP}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def migrated(db: OutboxTestDatabase) -> OutboxTestDatabase:
    result = outbox(db, "migrate")
    assert result.exit_code == 0, result.output
    assert "applied test_app/0001_app_kind" in result.output
    return db


def enqueue_default(db: OutboxTestDatabase, key: str) -> int:
    with db.connect() as conn:
        action_id = outbox_core.enqueue(conn, ActionRequest(KIND, "greetings", key)).id
        conn.commit()
    return action_id


def state(db: OutboxTestDatabase, action_id: int) -> ActionState:
    return ActionState(
        db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (action_id,))
    )


def test_an_app_plugin_registers_its_kind_beside_the_entry_points(app_env: None) -> None:
    host = load_plugins()
    assert KIND in host.registry
    assert host.registry.get(KIND).distribution == APP
    assert "test_app" in [line.name for line in host.migration_lines]


def test_outbox_migrate_applies_an_app_plugins_line(app_env: None, db: OutboxTestDatabase) -> None:
    migrated(db)
    assert db.scalar("SELECT line FROM {schema}.action_kind WHERE kind = %s", (KIND,)) == "test_app"


def test_the_default_outbox_and_the_executor_serve_an_app_plugins_kind(
    app_env: None, db: OutboxTestDatabase
) -> None:
    action_id = enqueue_default(migrated(db), "hello-1")
    outbox = Outbox.from_settings(OutboxSettings(strict_startup=True))
    executor = Executor(outbox, db.url)
    assert KIND in executor.kinds

    async def drain() -> int:
        async with executor:
            return await executor.drain()

    asyncio.run(drain())
    assert state(db, action_id) == ActionState.DONE


def test_outbox_plugins_and_status_list_an_app_plugins_kind(
    app_env: None, db: OutboxTestDatabase
) -> None:
    enqueue_default(migrated(db), "hello-1")
    listed = json.loads(outbox(db, "plugins").output)
    app = next(plugin for plugin in listed["plugins"] if plugin["distribution"] == APP)
    assert [kind["kind"] for kind in app["kinds"]] == [KIND]
    assert app["migrations"]["test_app"] == {"applied": [1], "pending": []}
    status = json.loads(outbox(db, "status", "--json").output)
    [counts] = [kind for kind in status["kinds"] if kind["kind"] == KIND]
    assert counts["due"] == 1


def test_outbox_run_carries_out_an_app_plugins_kind(app_env: None, db: OutboxTestDatabase) -> None:
    action_id = enqueue_default(migrated(db), "hello-1")
    env = {**os.environ, "OUTBOX_DATABASE_URL": db.url, "OUTBOX_SHUTDOWN_SECONDS": "5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox_core.cli", "run", "--strict"],
        env=env,
        cwd=PACKAGE_ROOT,  # the outbox command finds the application's modules from here
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while state(db, action_id) != ActionState.DONE:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the executor never ran the app plugin's action"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output


def test_an_app_plugin_that_cannot_be_imported_stops_start_up_naming_it(
    app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_APP_PLUGINS", f"{APP},tests.no_such_module")
    with pytest.raises(
        PluginLoadError,
        match=r"OUTBOX_APP_PLUGINS: the module 'tests\.no_such_module' failed to import: "
        r"ModuleNotFoundError",
    ):
        load_plugins()


def test_an_app_plugin_that_registers_nothing_stops_start_up_naming_it(
    app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_APP_PLUGINS", "tests.kinds")  # adapters, but no hookimpl
    with pytest.raises(
        PluginLoadError, match=r"OUTBOX_APP_PLUGINS: the module 'tests\.kinds' registers nothing"
    ):
        load_plugins()


def test_the_cli_names_an_app_plugin_that_cannot_be_imported(db: OutboxTestDatabase) -> None:
    env = {"OUTBOX_DATABASE_URL": db.url, "OUTBOX_APP_PLUGINS": "myapp_not_here.plugin"}
    forget_loaded_plugins()
    try:
        result = CliRunner().invoke(main, ["migrate"], env=env)
    finally:
        forget_loaded_plugins()
    assert result.exit_code == 1
    assert "OUTBOX_APP_PLUGINS: the module 'myapp_not_here.plugin' failed to import" in (
        result.output
    )


def test_the_blocklist_blocks_an_app_plugin_by_its_module_name(
    app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_DISABLE_PLUGINS", APP)
    host = load_plugins()
    assert KIND not in host.registry
    assert APP in host.blocked
