"""Lanes first, then their actions, without waiting for an action's lock while holding a lane.

A claim and a settle lock a lane and then change its head; a running attempt's transaction
(``attempt.transaction()``) and an ``ended`` hook hold an action's row and may enqueue into
its lane. An erasure or an operator's cancel that changes actions of a lane must not hold the
lane while it waits for one of those rows (its holder may be about to wait for the lane), nor
hold a row while it waits for the lane (a claim holding the lane may be about to wait for the
row). So it takes the lanes, then the rows without waiting (``NOWAIT``), inside a savepoint of
the caller's transaction; a row that another transaction holds rolls the savepoint back, which
lets the lanes go, and the whole step is tried again after a short, growing pause.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection

from .errors import OutboxError

T = TypeVar("T")

_SAVEPOINT = "outbox_lanes_first"


class LockAgain(Exception):
    """Raised by a step that found it must start again (with more lanes)."""


class LocksBusy(OutboxError):
    """Rows that an erasure or a cancel must change stayed locked by other transactions for
    longer than it was allowed to wait. Nothing was changed; the caller may try again."""


@asynccontextmanager
async def _savepoint(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A savepoint in the caller's transaction; a transaction of its own in autocommit mode.

    Not ``conn.transaction()``: on an idle connection outside autocommit, that block commits
    when it ends, and the caller's transaction must stay the caller's to commit."""
    if conn.autocommit:
        async with conn.transaction():
            yield
        return
    await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        yield
    except BaseException:
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        raise
    await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")


async def lanes_first(
    conn: AsyncConnection[Any],
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    wait_seconds: float,
) -> T:
    """Run ``step`` (lock the lanes, lock the rows with ``NOWAIT``, change them) in a savepoint,
    again while a row is busy, for up to ``wait_seconds``; then raise :class:`LocksBusy`."""
    deadline = time.monotonic() + wait_seconds
    pause = 0.01
    while True:
        try:
            async with _savepoint(conn):
                return await step()
        except (psycopg.errors.LockNotAvailable, LockAgain) as exc:
            if time.monotonic() + pause > deadline:
                raise LocksBusy(
                    f"{what}: rows stayed locked by other transactions (running attempts or "
                    f"endings) for {wait_seconds:g} s; nothing was changed, try again"
                ) from exc
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.5)
