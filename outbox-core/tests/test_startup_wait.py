"""`outbox run` started while its database restarts waits for it, one line a try, as a worker
under a supervisor should; a refused login fails at once; the wait has an end."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

from psycopg.conninfo import conninfo_to_dict

from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.pgproxy import ReplyLosingProxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start_run(url: str, wait_seconds: float) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_STARTUP_WAIT_SECONDS": str(wait_seconds),
        "OUTBOX_SHUTDOWN_SECONDS": "5",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_core.cli",
        "run",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


def url_at(db: OutboxTestDatabase, port: int, user: str | None = None) -> str:
    params = conninfo_to_dict(db.url)
    who = user or params.get("user") or "postgres"
    return f"postgresql://{who}@127.0.0.1:{port}/{db.name}?sslmode=disable&gssencmode=disable"


async def test_run_waits_for_a_database_that_is_not_answering_yet(db: OutboxTestDatabase) -> None:
    port = free_port()
    proc = await start_run(url_at(db, port), wait_seconds=120)
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"the database is not answering yet" in first, first
        # The server comes back (here: a way to it opens on the port the URL names).
        async with ReplyLosingProxy(db.url, port=port).running():
            deadline = time.monotonic() + 60
            while not db.scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN%%'"
            ):
                assert proc.returncode is None, "outbox run exited instead of waiting"
                assert time.monotonic() < deadline, "the executor never started listening"
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            output = (await asyncio.wait_for(proc.communicate(), 30))[0].decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, output


async def test_run_fails_at_once_when_the_login_is_refused(db: OutboxTestDatabase) -> None:
    params = conninfo_to_dict(db.url)
    port = int(params.get("port") or 5432)
    proc = await start_run(url_at(db, port, user="no_such_role_here"), wait_seconds=120)
    output = (await asyncio.wait_for(proc.communicate(), 30))[0].decode()
    assert proc.returncode == 1
    assert "trying again" not in output
    assert output.startswith("outbox: error: cannot reach the database:"), output
    assert "Traceback" not in output


async def test_run_gives_up_when_the_startup_wait_runs_out(db: OutboxTestDatabase) -> None:
    proc = await start_run(url_at(db, free_port()), wait_seconds=1)
    output = (await asyncio.wait_for(proc.communicate(), 30))[0].decode()
    assert proc.returncode == 1
    lines = output.strip().splitlines()
    assert any("trying again" in line for line in lines[:-1]), output
    assert lines[-1].startswith("outbox: error: cannot reach the database:"), output
    assert "Traceback" not in output
