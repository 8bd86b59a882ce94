"""The maintenance loop of every replica (no leader): expiry of admitted actions anywhere in
their lane, retention of ended ones, and the backlog gauges. Each step is a conditional
statement that two replicas can run at once."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import psycopg

from ..observability import BacklogSnapshot, event
from ..results import StopReason
from ..states import ActionState
from .endings import Endings
from .outcomes import Ending
from .runtime import Runtime


class Maintenance:
    def __init__(self, runtime: Runtime, endings: Endings) -> None:
        self.rt = runtime
        self.endings = endings
        self._blocked_counted_at: float | None = None
        self._lanes_blocked: dict[str, int] = {}

    async def loop(self) -> None:
        rt = self.rt
        period = rt.settings.maintenance_seconds
        await asyncio.sleep(random.uniform(0, period))
        while not rt.stopping:
            for step in (self.sweep_expired, self.sweep_retention, self.sample_gauges):
                try:
                    await step()
                except psycopg.Error as exc:
                    event(
                        "executor.maintenance.failed",
                        level=logging.WARNING,
                        step=step.__name__,
                        error=str(exc),
                    )
            rt.tally.flush()
            await asyncio.sleep(period * random.uniform(0.8, 1.2))

    async def sweep_expired(self) -> int:
        """End admitted actions past their expiry anywhere in their lane (CANCELLED, EXPIRED)."""
        params = {"limit": 500, **self.rt.filter_params()}
        async with self.rt.connection() as conn:
            cursor = await conn.execute(self.rt.queries["expired_actions"], params)
            rows = await cursor.fetchall()
        endings = [
            Ending(
                action_id,
                kind,
                lane_key,
                epoch,
                ActionState.ADMITTED,
                ActionState.CANCELLED,
                result="expire",
                stop_reason=StopReason.EXPIRED,
            )
            for action_id, kind, lane_key, epoch in rows
        ]
        answers = await asyncio.gather(*(self.endings.submit(ending) for ending in endings))
        return sum(answers)

    async def sweep_retention(self) -> int:
        """Delete ended actions older than the retention, of the kinds that keep it."""
        rt = self.rt
        kinds = [kind for kind, entry in rt.entries.items() if entry.adapter.retained]
        keep = rt.settings.retention_days * 86400.0
        deleted = 0
        async with rt.connection() as conn:
            for _ in range(100):
                cursor = await conn.execute(
                    rt.queries["retention_delete"], {"keep": keep, "kinds": kinds}
                )
                deleted += cursor.rowcount
                if cursor.rowcount < 1000:
                    break
        if deleted:
            event("retention.deleted", count=deleted)
        return deleted

    async def sample_backlog(self, *, blocked: bool = True) -> BacklogSnapshot:
        """Count the backlog gauges and publish them. ``blocked=False`` keeps the last count of
        blocked lanes, which costs a pass over the live actions (the maintenance loop counts
        it every ``blocked_lanes_seconds``)."""
        rt = self.rt
        snapshot = BacklogSnapshot()
        # Every served kind, also a stopped one: its due actions pile up, and that is the alert.
        flt = rt.served_filter
        params = {"kinds": flt.kinds, "paths": flt.paths, "suffixes": flt.suffixes}
        async with rt.connection() as conn, conn.transaction():
            # With a million rows the planner's cost passes the JIT threshold, and compiling
            # these scans took longer than running them (0.7 s of 1 s for blocked lanes).
            await conn.execute("SET LOCAL jit = off")
            cursor = await conn.execute(rt.queries["backlog"], params)
            for kind, due, executing, oldest, proposed in await cursor.fetchall():
                snapshot.due[kind] = due
                snapshot.executing[kind] = executing
                snapshot.oldest_due_age[kind] = oldest
                snapshot.proposed[kind] = proposed
            cursor = await conn.execute(rt.queries["uncertain_counts"], {"kinds": rt.served})
            snapshot.uncertain.update(dict(await cursor.fetchall()))
            if blocked or self._blocked_counted_at is None:
                cursor = await conn.execute(
                    rt.queries["blocked_lanes"], {**params, "limit": 100_000}
                )
                for row in await cursor.fetchall():
                    snapshot.lanes_blocked[row[0]] = snapshot.lanes_blocked.get(row[0], 0) + 1
                self._blocked_counted_at = time.monotonic()
                self._lanes_blocked = dict(snapshot.lanes_blocked)
            else:
                snapshot.lanes_blocked.update(self._lanes_blocked)
        rt.instruments.publish(snapshot)
        return snapshot

    async def sample_gauges(self) -> None:
        """The gauges, counting blocked lanes only every ``blocked_lanes_seconds``."""
        last = self._blocked_counted_at
        due = last is None or time.monotonic() - last >= self.rt.settings.blocked_lanes_seconds
        await self.sample_backlog(blocked=due)
