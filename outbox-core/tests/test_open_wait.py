"""An executor that opens while its database takes no connections (a failover or a restart
between `outbox run`'s start-up wait and the open) waits for it, one line a try
(`executor.database.waiting`), instead of dying on its session check with a traceback (the
failover chaos run, issue 35); the wait has an end."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from outbox_core import startup
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.pgproxy import ReplyLosingProxy

from .test_startup_wait import free_port, url_at


class Tries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "executor.database.waiting":
            self.count += 1
            self.seen.set()


@pytest.fixture
def tries() -> object:
    handler = Tries()
    logger = logging.getLogger("outbox")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def test_an_executor_that_opens_while_its_database_is_away_waits_for_it(
    db: OutboxTestDatabase, tries: Tries
) -> None:
    port = free_port()
    executor = db.executor()
    executor.rt.conninfo = url_at(db, port)
    opening = asyncio.create_task(executor.open())
    try:
        async with asyncio.timeout(60):
            await tries.seen.wait()  # it tried, and the database was not there
        # The server comes back (here: a way to it opens on the port the URL names).
        async with ReplyLosingProxy(db.url, port=port).running():
            async with asyncio.timeout(60):
                await opening
            assert executor.pool is not None
            await executor.close()
    finally:
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)


async def test_the_wait_of_an_executor_that_opens_has_an_end(
    db: OutboxTestDatabase, tries: Tries, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(startup, "OPEN_WAIT_SECONDS", 1.0)
    executor = db.executor()
    executor.rt.conninfo = url_at(db, free_port())
    with pytest.raises(psycopg.OperationalError):
        async with asyncio.timeout(60):
            await executor.open()
    assert tries.count >= 1
