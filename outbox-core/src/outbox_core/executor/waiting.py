"""Whether this executor waits for a wake-up, as the producers see it (migration 0016).

An enqueue notifies the schema's channel only when an executor waits (``wake_wanted_v1``):
PostgreSQL serialises the commits of the transactions that notified, so every notification
nobody needs costs concurrent producers their group commit. The claim loop waits through
:meth:`Waiting.wait` and says when it claimed without waiting (:meth:`Waiting.busy`).

Registering: the executor's row, keyed by the server's pid of the connection it LISTENs on, is
written and committed. An enqueue checks for rows after its insert, with a snapshot of its own;
one whose check came before the row was committed did not notify, and its transaction had its
id by then. So, once the row is committed, the executor draws a transaction id of its own and
watches every transaction below it that still runs (those of a snapshot taken then, and those
at or above that snapshot's xmax, which a snapshot does not list): it claims once at once (for
what committed before the row existed), then again each time the watched transactions are
fewer (one of them may have enqueued), looking after 2 ms, 4 ms and so on up to the poll, and
stops watching when none runs. An unrelated long transaction keeps being watched, at the poll's
pace, and delays nothing.

The row is written again at every poll that passes without a wake-up (so a row that an
operator or a sweep removed comes back, with a new watch), and deleted once the claim loop has
not waited for ``BUSY_SECONDS`` (it has a backlog, or every place is taken): producers then stop
notifying, and its next claim round finds their actions anyway. A row left by an executor that
was killed costs notifications nobody reads until the maintenance (``sweep_waiting``) removes
it.
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

LEAVE_SECONDS = 2.0
"""How long a shutdown waits to delete the executor's row (the sweep removes it otherwise)."""

REGISTER_RETRY_SECONDS = 1.0
"""After a registration failed (the first statement after a failover may meet a connection of
the pool that died with the old primary), how long the executor waits before it claims and
registers again, instead of the poll: without its row, producers do not notify it."""


class Waiting:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.listener_pid: int | None = None
        """The server's pid of the LISTEN connection while it is open (the listening task sets
        it from ``pg_backend_pid()``: a pooler's cancel key would not be one)."""
        self.registered: int | None = None
        """The pid of this executor's row in ``executor_waiting``, if it has one."""
        self._watch: tuple[str, int] | None = None
        """The registration's snapshot and the transaction id drawn after it (see above)."""
        self._running = 0
        self._look = FIRST_LOOK
        self._waited_at = time.monotonic()
        self._failed = False
        """The last registration failed: the next comes after REGISTER_RETRY_SECONDS."""

    async def wait(self, poll: float) -> None:
        """Wait for a wake-up, at most ``poll`` seconds, registered first; return early for the
        claim loop to claim when a registration was just made, or when fewer of the
        transactions that may have missed it run."""
        try:
            if await self._register():
                return  # claim once: what committed before the row existed notified nobody
            if self._failed:
                poll = min(poll, REGISTER_RETRY_SECONDS)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + poll
            while (remaining := deadline - loop.time()) > 0:
                watching = self._watch is not None
                try:
                    await asyncio.wait_for(
                        self.rt.wake.wait(), min(remaining, self._look) if watching else remaining
                    )
                    return
                except TimeoutError:
                    pass
                if watching and await self._fewer_running():
                    return
            self.registered = None  # a poll without a wake-up: register again (see above)
        finally:
            self._waited_at = time.monotonic()

    async def busy(self) -> None:
        """The claim loop claimed again without waiting: after ``BUSY_SECONDS`` of that, leave."""
        if self.registered is not None and time.monotonic() - self._waited_at > BUSY_SECONDS:
            await self.leave()

    async def leave(self) -> None:
        """Delete this executor's row (producers stop notifying for it); best effort."""
        pid = self.registered if self.registered is not None else self.listener_pid
        self.registered, self._watch = None, None
        if pid is None:
            return
        try:
            async with asyncio.timeout(LEAVE_SECONDS), self.rt.connection() as conn:
                await conn.execute(self.rt.queries["waiting_leave"], {"pids": [pid]})
        except (psycopg.Error, TimeoutError) as exc:
            # The row stays until the sweep finds its listener gone: notifications only.
            event("executor.waiting.failed", level=logging.WARNING, error=str(exc))

    async def _register(self) -> bool:
        """Write this executor's row and start watching; whether it did."""
        pid = self.listener_pid
        if pid is None or pid == self.registered:
            return False  # not listening (nothing would reach it), or registered already
        queries = self.rt.queries
        try:
            async with self.rt.connection() as conn:
                # Autocommit: each statement commits before the next begins.
                await conn.execute(queries["waiting_register"], {"pid": pid})
                cursor = await conn.execute(queries["waiting_watch"])
                row = await cursor.fetchone()
        except psycopg.Error as exc:
            # Producers may then not notify: this executor claims and tries again soon.
            event("executor.waiting.failed", level=logging.WARNING, error=str(exc))
            self._failed = True
            return False
        assert row is not None
        self._failed = False
        self.registered, self._watch = pid, (str(row[0]), int(row[1]))
        self._running, self._look = -1, FIRST_LOOK
        return True

    async def _fewer_running(self) -> bool:
        """Whether fewer of the watched transactions run than at the last look (the first look
        counts as fewer when none runs); the next look comes later when not."""
        assert self._watch is not None
        snapshot, drawn = self._watch
        try:
            async with self.rt.connection() as conn:
                cursor = await conn.execute(
                    self.rt.queries["waiting_running"], {"snapshot": snapshot, "drawn": drawn}
                )
                row = await cursor.fetchone()
        except psycopg.Error:
            return True  # claim now: the claim's own error handling takes over
        running = int(row[0]) if row is not None else 0
        fewer = running == 0 or (self._running >= 0 and running < self._running)
        if running == 0:
            self._watch = None
        self._running = running
        self._look = min(self._look * 2, self.rt.settings.poll_seconds)
        return fewer
