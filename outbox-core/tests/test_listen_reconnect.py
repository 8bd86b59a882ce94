"""A LISTEN connection that cannot be made again (the database went away: a restart, a failover)
is tried again within a second, every second, not after a pause that doubles to half a minute:
each second without LISTEN is start latency for what is enqueued meanwhile (issue 35)."""

from __future__ import annotations

import asyncio
import logging
import socket

from outbox_core.executor import Executor
from outbox_core.executor.claims import LISTEN_RETRY_SECONDS
from outbox_core.testing import OutboxTestDatabase


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Pauses(logging.Handler):
    """The pauses that the listener's ``executor.listen.lost`` events announce."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.seen: list[float] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "executor.listen.lost":
            self.seen.append(float(getattr(record, "retry.in")))
            if len(self.seen) >= self.wanted:
                self.enough.set()


async def test_a_lost_listen_connection_is_tried_again_at_least_every_second(
    db: OutboxTestDatabase,
) -> None:
    gone = f"host=127.0.0.1 port={closed_port()} dbname=outbox user=postgres connect_timeout=2"
    executor = Executor(db.outbox, gone, settings=db.settings)
    pauses = Pauses(5)
    logger = logging.getLogger("outbox")
    logger.addHandler(pauses)
    task = asyncio.create_task(executor.claims.listen())
    try:
        async with asyncio.timeout(120):
            await pauses.enough.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        logger.removeHandler(pauses)
    assert LISTEN_RETRY_SECONDS == (0.5, 1.0)
    assert pauses.seen[:5] == [0.5, 1.0, 1.0, 1.0, 1.0]
