"""Under `outbox run`, the libraries log from WARNING unless asked (issue 31 item 9): httpx's
INFO line for every request (its URL, query included) is not in the executor's log by default,
and `--library-log-level INFO` brings it back."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

from .library_logs import KIND

REPO = Path(__file__).resolve().parents[1]


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        thread.join(10)


def _outbox(db: OutboxTestDatabase, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", *args],
        env={
            **env,
            "OUTBOX_DATABASE_URL": db.url,
            "OUTBOX_PLUGINS": "",
            "OUTBOX_APP_PLUGINS": "tests.library_logs",
        },
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def _fetch(db: OutboxTestDatabase, url: str, key: str) -> None:
    from outbox_core import Outbox
    from outbox_core.plugins import build_host

    host = build_host(use_entry_points=False, app_plugins=["tests.library_logs"])
    outbox = Outbox(schema=db.schema, registry=host.registry, host=host)
    with db.connect() as conn:
        outbox.enqueue(conn, ActionRequest(KIND, key, key, {"url": f"{url}?token=query-4711"}))
        conn.commit()


def test_httpx_request_lines_stay_out_of_outbox_runs_log_unless_asked(
    outbox_db: OutboxTestDatabase, server: str
) -> None:
    db = outbox_db
    _outbox(db, "migrate")
    _fetch(db, server, "quiet")
    quiet = _outbox(db, "run", "--once")
    assert "claimed 1, done 1," in quiet.stdout
    assert "query-4711" not in quiet.stderr and " httpx " not in quiet.stderr, quiet.stderr

    _fetch(db, server, "asked")
    asked = _outbox(db, "run", "--once", "--library-log-level", "INFO")
    assert "claimed 1, done 1," in asked.stdout
    assert " INFO httpx HTTP Request: GET " in asked.stderr, asked.stderr
