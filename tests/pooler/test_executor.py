"""The executor through PgBouncer: it needs a server session per connection (LISTEN, its
prepared claim and settle, the pid that names its wake-up row), so it refuses a database URL
in transaction pooling at start-up, in one line, and runs through session pooling, woken by
the producers' notifications (docs/operations.md, "A connection pooler")."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from outbox_core import ConfigurationError
from outbox_core.testing import OutboxTestDatabase

from .bouncer import Bouncer
from .test_producers import confirm

OUTBOX = str(Path(sys.executable).parent / "outbox")
WAIT = 60.0  # a bound on a wait under load; the poll below is ten times longer


async def eventually(found: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            if found():
                return
            await asyncio.sleep(0.05)


async def test_an_executor_refuses_to_open_through_transaction_pooling(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    executor = db.executor()
    executor.rt.conninfo = pooled_url
    with pytest.raises(ConfigurationError, match="pooler in transaction mode"):
        await executor.open()
    assert executor.pool is None  # refused before its pool or its LISTEN opened


def test_outbox_run_through_transaction_pooling_exits_with_one_line(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
    env["OUTBOX_DATABASE_URL"] = pooled_url
    done = subprocess.run(
        [OUTBOX, "run"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    # The plugins' own start-up warnings (log records) may come first; the refusal is a line.
    errors = [line for line in done.stderr.splitlines() if " WARNING " not in line]
    assert len(errors) == 1 and "pooler in transaction mode" in errors[0], done.stderr
    assert "pool_mode = session" in errors[0]


async def test_an_executor_through_session_pooling_is_woken_by_an_enqueue_through_transaction_pooling(
    db: OutboxTestDatabase, session_pooler: Bouncer, pooled_url: str
) -> None:
    executor = db.executor(poll_seconds=600.0)  # a poll would not come within WAIT
    executor.rt.conninfo = session_pooler.url(db.url)
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        # Registered for wake-ups under its LISTEN session's server pid, not PgBouncer's key.
        await eventually(lambda: bool(db.scalar("SELECT count(*) FROM {schema}.executor_waiting")))
        listening = db.scalar(
            "SELECT count(*) FROM {schema}.executor_waiting w JOIN pg_stat_activity a"
            " ON a.pid = w.listener_pid WHERE a.query LIKE 'LISTEN %%'"
        )
        assert listening == 1
        connect = psycopg.AsyncConnection.connect
        async with (
            await connect(pooled_url, prepare_threshold=None) as producer,
            producer.transaction(),
        ):
            enqueued = await db.outbox.aenqueue(producer, confirm(1))
        state = "SELECT state FROM {schema}.agent_action WHERE id = %s"
        await eventually(lambda: db.scalar(state, (enqueued.id,)) == "DONE")
    finally:
        stop.set()
        await running
