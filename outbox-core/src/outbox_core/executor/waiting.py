"""Whether this executor waits for a wake-up, as the producers see it (migration 0016).

An enqueue notifies the schema's channel only when an executor waits (``wake_wanted_v1``):
PostgreSQL serialises the commits of the transactions that notified, so every notification
nobody needs costs concurrent producers their group commit. The claim loop waits through
:meth:`Waiting.wait` and says when it claimed without waiting (:meth:`Waiting.busy`).

Registering: the executor's row, keyed by the backend of the connection it LISTENs on, is
written and committed; then the transactions still running are noted (a snapshot). An enqueue
among them may have inserted before the row existed and so not notified; one that begins later
sees the row (its check reads a snapshot of its own, taken after its insert). So the wait looks,
after 2 ms, 4 ms and so on up to the poll, whether every one of those transactions has ended,
and when they have, returns so that the loop claims once more: their actions are visible then.

Leaving: once the claim loop has not waited for ``BUSY_SECONDS`` (it has a backlog, or every
place is taken), the row is deleted and producers stop notifying; its next claim round finds
their actions anyway. It registers again before it next waits. A row left by an executor that
was killed costs notifications nobody reads until :func:`sweep` (the maintenance) removes it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from ..observability import event
from .runtime import Runtime

BUSY_SECONDS = 1.0
"""How long the claim loop goes without waiting before its executor stops asking producers
for wake-ups."""

FIRST_LOOK = 0.002
"""The first look at the transactions that may have missed a registration (then doubled)."""


class Waiting:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.listener_pid: int | None = None
        """The backend of the LISTEN connection while it is open (set by the listening task)."""
        self.registered: int | None = None
        """The pid of this executor's row in ``executor_waiting``, if it has one."""
        self._snapshot: str | None = None
        self._look = FIRST_LOOK
        self._waited_at = time.monotonic()

    async def wait(self, poll: float) -> None:
        """Wait for a wake-up, at most ``poll`` seconds, registered first; return early when the
        transactions that may have missed the registration have all ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll
        await self._register()
        while (remaining := deadline - loop.time()) > 0:
            watching = self._snapshot is not None
            try:
                await asyncio.wait_for(
                    self.rt.wake.wait(), min(remaining, self._look) if watching else remaining
                )
                break
            except TimeoutError:
                pass
            if watching and await self._drained():
                break
        self._waited_at = time.monotonic()

    async def busy(self) -> None:
        """The claim loop claimed again without waiting: after ``BUSY_SECONDS`` of that, leave."""
        if self.registered is not None and time.monotonic() - self._waited_at > BUSY_SECONDS:
            await self.leave()

    async def leave(self) -> None:
        """Delete this executor's row (producers stop notifying for it); best effort."""
        pid, self.registered, self._snapshot = self.registered, None, None
        if pid is None:
            return
        try:
            async with self.rt.connection() as conn:
                await conn.execute(self.rt.queries["waiting_leave"], {"pids": [pid]})
        except psycopg.Error as exc:
            # The row stays until the sweep finds its listener gone: notifications only.
            event("executor.waiting.failed", level=logging.WARNING, error=str(exc))

    async def _register(self) -> None:
        pid = self.listener_pid
        if pid is None or pid == self.registered:
            return  # not listening (nothing would reach it), or registered already
        queries = self.rt.queries
        try:
            async with self.rt.connection() as conn:
                if self.registered is not None:  # a row of a LISTEN connection since lost
                    await conn.execute(queries["waiting_leave"], {"pids": [self.registered]})
                # Autocommit: the row is committed before the snapshot below is taken.
                await conn.execute(queries["waiting_register"], {"pid": pid})
                cursor = await conn.execute(queries["waiting_snapshot"])
                row = await cursor.fetchone()
        except psycopg.Error as exc:
            # Producers may then not notify: this executor finds their actions at its poll.
            event("executor.waiting.failed", level=logging.WARNING, error=str(exc))
            return
        assert row is not None
        self.registered, self._snapshot, self._look = pid, str(row[0]), FIRST_LOOK

    async def _drained(self) -> bool:
        """Whether every transaction running at the registration has ended (then the claim
        loop claims once more); else the next look comes later."""
        try:
            async with self.rt.connection() as conn:
                cursor = await conn.execute(
                    self.rt.queries["waiting_drained"], {"snapshot": self._snapshot}
                )
                row = await cursor.fetchone()
        except psycopg.Error:
            return True  # claim now: the claim's own error handling takes over
        if row is not None and row[0]:
            self._snapshot = None
            return True
        self._look = min(self._look * 2, self.rt.settings.poll_seconds)
        return False


async def sweep(runtime: Runtime) -> None:
    """Remove the rows of executors whose listening connection is gone."""
    async with runtime.connection() as conn:
        await conn.execute(runtime.queries["waiting_sweep"])
