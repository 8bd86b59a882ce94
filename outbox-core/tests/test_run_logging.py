"""`outbox run` says what it does: a start line and a shutdown line on stderr, as text or as
JSON, never the database password; an application's own logging is left alone."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from outbox_core.testing import OutboxTestDatabase

from .app_plugin import KIND as APP_KIND

PASSWORD = "never-in-a-log-4711"


def run_until_listening(db: OutboxTestDatabase, *args: str) -> str:
    """``outbox run`` in a subprocess with a password in its URL (the test server trusts every
    login, so it is ignored), stopped with SIGTERM once it listens; its stderr."""
    url = make_conninfo(db.url, password=PASSWORD)
    # A kind of the test application's own (only the core is installed in the core's session).
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_SHUTDOWN_SECONDS": "5",
        "OUTBOX_APP_PLUGINS": "tests.app_plugin",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox_core.cli", "run", *args],
        env=env,
        cwd=Path(__file__).resolve().parents[1],  # where `tests` is importable from
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN%%'"
        ):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the executor never started listening"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    return stderr


def test_run_logs_a_start_and_a_shutdown_line_without_the_password(
    db: OutboxTestDatabase,
) -> None:
    stderr = run_until_listening(db)
    assert PASSWORD not in stderr
    [started] = [line for line in stderr.splitlines() if " executor.started " in line]
    assert " INFO outbox executor.started version=" in started
    assert f"({APP_KIND})" in started.split("plugins=", 1)[1]  # the kinds, by their plugin
    assert f"schema={db.schema}" in started and f"/{db.name}" in started, started
    assert "concurrency=100" in started
    assert any(" INFO outbox executor.stopped " in line for line in stderr.splitlines())


def test_run_logs_one_json_object_a_line(db: OutboxTestDatabase) -> None:
    stderr = run_until_listening(db, "--log-format", "json", "--log-level", "debug")
    assert PASSWORD not in stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    by_event = {record.get("event"): record for record in records}
    started = by_event["executor.started"]
    assert started["level"] == "INFO" and started["schema"] == db.schema
    assert started["database"].endswith(f"/{db.name}")
    assert APP_KIND in started["plugins"] and APP_KIND in started["kinds"].split(",")
    assert "executor.stopped" in by_event


def test_an_application_that_configured_logging_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outbox_core.observability import configure_logging

    root = logging.getLogger()
    own = logging.NullHandler()
    monkeypatch.setattr(root, "handlers", [own])
    monkeypatch.setattr(root, "level", logging.ERROR)
    assert configure_logging("DEBUG", "json") is False
    assert root.handlers == [own] and root.level == logging.ERROR
    monkeypatch.setattr(root, "handlers", [])
    assert configure_logging("DEBUG", "json") is True
    assert len(root.handlers) == 1 and root.level == logging.DEBUG
