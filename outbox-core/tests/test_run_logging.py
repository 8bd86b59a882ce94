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


def run_until_listening(
    db: OutboxTestDatabase, *args: str, env: dict[str, str] | None = None
) -> str:
    """``outbox run`` in a subprocess with a password in its URL (the test server trusts every
    login, so it is ignored), stopped with SIGTERM once it listens; its stderr."""
    url = make_conninfo(db.url, password=PASSWORD)
    # A kind of the test application's own (only the core is installed in the core's session).
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_SHUTDOWN_SECONDS": "5",
        "OUTBOX_APP_PLUGINS": "tests.app_plugin",
        **(env or {}),
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
    monkeypatch.setattr(logging.getLogger("outbox"), "level", logging.NOTSET)
    assert configure_logging("DEBUG", "json") is False
    assert root.handlers == [own] and root.level == logging.ERROR
    assert logging.getLogger("outbox").level == logging.NOTSET
    monkeypatch.setattr(root, "handlers", [])
    assert configure_logging("DEBUG", "json") is True
    # outbox's own records from DEBUG, the libraries' from WARNING (--library-log-level).
    assert len(root.handlers) == 1 and root.level == logging.WARNING
    assert logging.getLogger("outbox").level == logging.DEBUG


def _progress(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "executor.progress"]


def test_an_idle_period_logs_no_progress_line(caplog: pytest.LogCaptureFixture) -> None:
    from outbox_core.executor.progress import Progress
    from outbox_core.states import ActionState

    caplog.set_level(logging.INFO, logger="outbox")
    progress = Progress()
    assert progress.report(60.0, in_flight=0) is False
    progress.claimed += 1
    progress.count_ended(ActionState.DONE)
    progress.count_ended(ActionState.ADMITTED)  # a retry: waits again
    assert progress.report(60.0, in_flight=2) is True
    assert progress.report(60.0, in_flight=0) is False  # counted afresh after each line
    [line] = _progress(caplog)
    assert line.getMessage() == (
        "executor.progress seconds=60.0 claimed=1 done=1 failed=0 cancelled=0 uncertain=0 "
        "rescheduled=1 running=2"
    )


async def test_a_busy_executor_logs_its_counts_each_period_and_then_falls_quiet(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Failed

    from .kinds import ScriptedAdapter

    async def refuse(attempt: ActionAttempt) -> AdapterResult:
        return Failed("NOPE")

    ScriptedAdapter.script = refuse
    caplog.set_level(logging.INFO, logger="outbox")
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn,
            [ActionRequest("TEST_NOOP", f"lane-{i % 7}", f"noop-{i}") for i in range(30)]
            + [ActionRequest("TEST_SCRIPTED", f"other-{i}", f"refused-{i}") for i in range(5)],
        )
        conn.commit()

    def total(field: str) -> int:
        return sum(getattr(record, field) for record in _progress(caplog))

    stop = asyncio.Event()
    executor = db.executor(progress_seconds=0.2)
    runner = asyncio.create_task(executor.run(stop))
    try:
        deadline = time.monotonic() + 60
        while (total("done"), total("failed")) != (30, 5):
            assert not runner.done(), runner
            assert time.monotonic() < deadline, [r.getMessage() for r in _progress(caplog)]
            await asyncio.sleep(0.05)
        assert total("claimed") == 35
        assert (total("cancelled"), total("uncertain"), total("rescheduled")) == (0, 0, 0)
        await asyncio.gather(*executor.attempts.running, return_exceptions=True)
        await asyncio.sleep(0.3)  # a line about the last attempt leaving may still come
        quiet_from = len(_progress(caplog))
        await asyncio.sleep(1.0)  # five periods with nothing to do
        assert len(_progress(caplog)) == quiet_from
    finally:
        stop.set()
        await runner
        await executor.close()


def test_run_with_no_kind_to_run_says_so(db: OutboxTestDatabase) -> None:
    """No plugin registers a kind (only the core is installed, or every plugin is blocked):
    the executor runs, and its first line says why it will do nothing."""
    stderr = run_until_listening(db, env={"OUTBOX_APP_PLUGINS": "", "OUTBOX_PLUGINS": ""})
    [warning] = [line for line in stderr.splitlines() if "executor.kinds.none" in line]
    assert " WARNING outbox executor.kinds.none detail=no installed plugin registers a kind" in (
        warning
    )


def _run_once(db: OutboxTestDatabase, *args: str) -> str:
    """``outbox run --once``; its stderr."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "run", "--once", *args],
        env={**env, "OUTBOX_DATABASE_URL": db.url, "OUTBOX_PLUGINS": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_libraries_info_lines_are_logged_only_when_asked(db: OutboxTestDatabase) -> None:
    """psycopg.pool logs a line at INFO for every connection the executor takes from its pool:
    not in outbox run's log unless --library-log-level asks (then psycopg's own WARNING, set
    when it is imported, gives way too). httpx's line per request: tests/test_run_library_logs."""
    assert " psycopg.pool " not in _run_once(db)
    asked = _run_once(db, "--library-log-level", "INFO")
    assert " INFO psycopg.pool connection requested from 'outbox-executor'" in asked, asked


def test_the_text_format_puts_a_librarys_message_of_several_lines_on_one_line() -> None:
    from outbox_core.observability import TextFormatter

    record = logging.LogRecord(
        "psycopg.pool",
        logging.WARNING,
        __file__,
        1,
        "error connecting in %r: %s",
        (
            "pool-1",
            'connection to server at "db" failed: Connection refused\n\tIs the server '
            "running on that host and accepting TCP/IP connections?\n",
        ),
        None,
    )
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert line.endswith(
        "WARNING psycopg.pool error connecting in 'pool-1': connection to server at \"db\" "
        "failed: Connection refused Is the server running on that host and accepting TCP/IP "
        "connections?"
    )
