"""The dashboard and its database (issue 31 item 8): `outbox dashboard` refuses to start in one
line when the database is unreachable or not migrated, as every other command does, and a
dashboard whose database goes away while it runs says so in a banner (503), with no traceback,
on the page, on the live panels and on the event stream."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import httpx
import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient

from outbox_core.dashboard import create_app
from outbox_core.testing import OutboxTestDatabase

from .conftest import Served


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dashboard(url: str) -> subprocess.CompletedProcess[str]:
    """`outbox dashboard` in a process of its own; one that starts serving is a failure here
    (it would serve until the timeout)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "dashboard", "--port", str(_free_port())],
        env={**env, "OUTBOX_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_outbox_dashboard_refuses_to_start_in_one_line_when_the_database_is_unreachable() -> None:
    done = _dashboard(f"postgresql://postgres@127.0.0.1:{_free_port()}/nowhere")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("outbox: error: cannot reach the database: ")
    assert done.stdout == ""  # no "outbox dashboard on http://..."


def test_outbox_dashboard_refuses_to_start_in_one_line_when_the_database_is_not_migrated(
    empty_database: str,
) -> None:
    done = _dashboard(empty_database)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "outbox: error: the database has no outbox schema 'outbox' (never migrated, or another "
        "OUTBOX_SCHEMA): run `outbox migrate`"
    ]
    assert done.stdout == ""


def _drop(outbox_server: str, db: OutboxTestDatabase) -> None:
    with psycopg.connect(outbox_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db.name))
        )


def test_the_page_and_the_live_panels_show_a_banner_when_the_database_goes_away(
    db: OutboxTestDatabase, outbox_server: str
) -> None:
    client = TestClient(create_app(db.outbox, db.url))  # it raises what the app did not handle
    assert client.get("/").status_code == 200
    _drop(outbox_server, db)
    for path in ("/", "/panels"):
        page = client.get(path)
        assert page.status_code == 503, path
        assert 'id="database-down"' in page.text
        assert "cannot reach the database" in page.text and "tries again" in page.text
        assert 'id="backlog"' not in page.text


def test_the_event_stream_says_so_when_the_database_goes_away_and_logs_no_traceback(
    served: Served, db: OutboxTestDatabase, outbox_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    _drop(outbox_server, db)
    caplog.set_level(logging.WARNING)
    with httpx.stream("GET", served.url + "events", timeout=30) as events:
        assert events.status_code == 200
        lines = events.iter_lines()
        assert next(lines) == "event: refresh"
        assert next(lines) == "data: database-down"
    page = httpx.get(served.url, timeout=30)
    assert page.status_code == 503 and 'id="database-down"' in page.text
    assert [record for record in caplog.records if record.exc_info] == []
