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
from .steps import Sleep, Steps, atomic

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


class _Pauses:
    """The pauses between tries: short and growing, until ``wait_seconds`` are spent."""

    def __init__(self, what: str, wait_seconds: float) -> None:
        self.what = what
        self.wait_seconds = wait_seconds
        self.deadline = time.monotonic() + wait_seconds
        self.pause = 0.01

    def after(self, exc: BaseException) -> float:
        """The pause before the next try; :class:`LocksBusy` once the time is spent."""
        if time.monotonic() + self.pause > self.deadline:
            raise LocksBusy(
                f"{self.what}: rows stayed locked by other transactions (running attempts or "
                f"endings) for {self.wait_seconds:g} s; nothing was changed, try again"
            ) from exc
        pause = self.pause * random.uniform(0.5, 1.5)
        self.pause = min(self.pause * 2, 0.5)
        return pause


async def lanes_first(
    conn: AsyncConnection[Any],
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    wait_seconds: float,
) -> T:
    """Run ``step`` (lock the lanes, lock the rows with ``NOWAIT``, change them) in a savepoint,
    again while a row is busy, for up to ``wait_seconds``; then raise :class:`LocksBusy`."""
    pauses = _Pauses(what, wait_seconds)
    while True:
        try:
            async with _savepoint(conn):
                return await step()
        except (psycopg.errors.LockNotAvailable, LockAgain) as exc:
            await asyncio.sleep(pauses.after(exc))


def lanes_first_steps(step: Callable[[], Steps[T]], *, what: str, wait_seconds: float) -> Steps[T]:
    """:func:`lanes_first` as steps (see :mod:`outbox_core.steps`), for sync and async code."""
    pauses = _Pauses(what, wait_seconds)
    while True:
        try:
            return (yield from atomic(step()))
        except (psycopg.errors.LockNotAvailable, LockAgain) as exc:
            yield Sleep(pauses.after(exc))
