"""The maintenance loop of every replica (no leader): expiry of admitted actions anywhere in
their lane, retention of ended ones, and the backlog gauges. Each step is a conditional
statement that two replicas can run at once."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import datetime, timedelta

import psycopg

from .. import live_reads
from ..observability import BacklogSnapshot, event
from ..results import StopReason
from ..states import ActionState
from .endings import Endings
from .outcomes import Ending
from .runtime import Runtime

# The due gauge reads at most this many lanes of each kind whose next look has come (and as
# many of unknown head), earliest first: the cost of a sample stays bounded when a backlog of
# due lanes piles up, and a due count of this many reads "this many or more".
DUE_LANES_READ = 10_000
# Expiry reads the expiries that came due since its last sweep (no index of admitted actions
# only: migration 21), from this long before that sweep, for the enqueues that committed
# after it with an expiry already past; and every expiry when the executor starts and once
# every EXPIRY_FULL_SECONDS after, for anything those windows missed.
EXPIRY_MARGIN = timedelta(seconds=60)
EXPIRY_FULL_SECONDS = 3600.0
# Retention reads a kind's actions in id order up to the first one enqueued after the cutoff,
# at most RETENTION_WALK a statement and RETENTION_STATEMENTS statements a sweep, shared by the
# kinds (each kind at least RETENTION_KIND_STATEMENTS): a sweep's cost stays bounded however
# many old live actions a kind holds, and a pass that has more to read goes on from there at
# the next sweep. A pass starts where the last one stopped (the actions below were read then:
# those that became deletable since are the ones whose creation passed the cutoff), and from
# the kind's first action at the first sweep and every RETENTION_FULL_SECONDS, for the old ones
# that were live or ended since when last read.
RETENTION_WALK = 1000
RETENTION_STATEMENTS = 100
RETENTION_KIND_STATEMENTS = 10
RETENTION_FULL_SECONDS = 3600.0


class Maintenance:
    def __init__(self, runtime: Runtime, endings: Endings) -> None:
        self.rt = runtime
        self.endings = endings
        self._full_counted_at: float | None = None
        # The last full counts, published between them: waiting, proposed, lanes blocked.
        self._full_counts: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        # Whether the last count of every live action found more than the lanes' budget: the
        # next one reads the table at once (live_reads.LANE_READ_BUDGET), not the budget first.
        self._live_over_budget = False
        # Expiry: the expiries after this time are read (None: every one), and when it last
        # read every one (monotonic).
        self._expiry_since: datetime | None = None
        self._expiry_full_at: float | None = None
        # Retention: where each kind's pass in progress goes on from; where each kind's next
        # pass starts (absent: from its first action); when the last full passes began.
        self._retention_after: dict[str, int] = {}
        self._retention_from: dict[str, int] = {}
        self._retention_full_at: float | None = None

    async def loop(self) -> None:
        rt = self.rt
        period = rt.settings.maintenance_seconds
        await asyncio.sleep(random.uniform(0, period))
        while not rt.stopping:
            for step in (
                self.sweep_expired,
                self.sweep_retention,
                self.sample_gauges,
                self.sweep_waiting,
            ):
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

    async def sweep_waiting(self) -> None:
        """Remove the wake-up registrations of executors that are gone (waiting.py)."""
        async with self.rt.connection() as conn:
            await conn.execute(self.rt.queries["waiting_sweep"])

    async def sweep_expired(self, *, full: bool = False) -> int:
        """End admitted actions past their expiry anywhere in their lane (CANCELLED, EXPIRED):
        those that came due since the last sweep (less :data:`EXPIRY_MARGIN`), every one at
        the first sweep, every :data:`EXPIRY_FULL_SECONDS` and when ``full``."""
        full = (
            full
            or self._expiry_since is None
            or self._expiry_full_at is None
            or time.monotonic() - self._expiry_full_at >= EXPIRY_FULL_SECONDS
        )
        limit = 500
        params = {
            "limit": limit,
            "since": "-infinity" if full else self._expiry_since,
            **self.rt.filter_params(),
        }
        async with self.rt.connection() as conn:
            cursor = await conn.execute(self.rt.queries["database_now"])
            now = (await cursor.fetchall())[0][0]
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
        # The window moves on once its expirations are written (a failed write leaves it, so
        # the next sweep reads those actions again) and when it held them all (else more are
        # due in it: read it again next time).
        if len(rows) < limit:
            self._expiry_since = now - EXPIRY_MARGIN
            if full:
                self._expiry_full_at = time.monotonic()
        return sum(answers)

    async def sweep_retention(self) -> int:
        """Delete ended actions older than the retention, of the kinds that keep it: each
        kind's actions walked in id order up to the first one enqueued after the cutoff, a
        bounded number of statements a pass (see :data:`RETENTION_STATEMENTS`)."""
        rt = self.rt
        kinds = [kind for kind, entry in rt.entries.items() if entry.adapter.retained]
        if not kinds:
            return 0
        keep = rt.settings.retention_days * 86400.0
        share = max(RETENTION_KIND_STATEMENTS, RETENTION_STATEMENTS // len(kinds))
        full = (
            self._retention_full_at is None
            or time.monotonic() - self._retention_full_at >= RETENTION_FULL_SECONDS
        )
        if full:
            self._retention_full_at = time.monotonic()
        deleted = 0
        async with rt.connection() as conn:
            for kind in kinds:
                after = self._retention_after.get(kind)
                if after is None:
                    after = 0 if full else self._retention_from.get(kind, 0)
                for _ in range(share):
                    params = {"kind": kind, "after": after, "limit": RETENTION_WALK, "keep": keep}
                    cursor = await conn.execute(rt.queries["retention_delete"], params)
                    gone, over, last, recent = (await cursor.fetchall())[0]
                    deleted += gone
                    if over:
                        self._retention_after.pop(kind, None)
                        self._retention_from[kind] = (
                            recent - 1 if recent is not None else (last or after)
                        )
                        break
                    after = self._retention_after[kind] = last
        if deleted:
            event("retention.deleted", count=deleted)
        return deleted

    async def sample_backlog(self, *, blocked: bool = True) -> BacklogSnapshot:
        """Count the backlog gauges and publish them. ``blocked=False`` keeps the last counts
        that cost a pass over every live action (the blocked lanes, the waiting and the
        proposed actions), which the maintenance loop takes every ``blocked_lanes_seconds``;
        the due heads and the executing actions are counted each time, at a cost bounded by
        their number (docs/metrics.md)."""
        rt = self.rt
        snapshot = BacklogSnapshot()
        # Every served kind, also a stopped one: its due actions pile up, and that is the alert.
        params: dict[str, object] = rt.served_filter.params()
        full = blocked or self._full_counted_at is None
        async with rt.connection() as conn, conn.transaction():
            # One snapshot for every count: the waiting actions are the admitted ones less the
            # due heads, counted by two statements.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # With a million rows the planner's cost passes the JIT threshold, and compiling
            # these scans took longer than running them (0.7 s of 1 s for blocked lanes).
            await conn.execute("SET LOCAL jit = off")
            cursor = await conn.execute(
                rt.queries["backlog_due"], {**params, "limit": DUE_LANES_READ}
            )
            due_admitted: dict[str, int] = {}
            for kind, due, admitted, oldest, _oldest_id in await cursor.fetchall():
                snapshot.due[kind] = due
                snapshot.oldest_due_age[kind] = oldest
                due_admitted[kind] = admitted
            cursor = await conn.execute(rt.queries["backlog_executing"], params)
            snapshot.executing.update(dict(await cursor.fetchall()))
            cursor = await conn.execute(rt.queries["uncertain_counts"], {"kinds": rt.served})
            snapshot.uncertain.update(dict(await cursor.fetchall()))
            if full:
                cursor = await conn.execute(rt.queries["live_read_sizes"])
                ((lane_bytes, action_bytes),) = await cursor.fetchall()
                params["scan"] = by_table = live_reads.by_table(lane_bytes, action_bytes)

                async def backlog_counts(scan: bool, budget: int) -> list[tuple[object, ...]]:
                    counted = await conn.execute(
                        rt.queries["backlog_counts"], {**params, "scan": scan, "budget": budget}
                    )
                    rows = await counted.fetchall()
                    if scan:  # every live action read: would the lanes hold them next time?
                        self._live_over_budget = live_reads.over_budget(rows, budget)
                    return rows

                # The live actions change little in a minute: once they passed the lanes'
                # budget, the next counts read the table at once (in 10,000 lanes of 100, the
                # budget read lane by lane cost 0.39 s before the table's 0.23 s), until a count
                # of the table finds fewer.
                counts, _ = await live_reads.acount_live(
                    backlog_counts, by_table or self._live_over_budget
                )
                for kind, (admitted, proposals) in counts.items():
                    if admitted > due_admitted.get(kind, 0):
                        snapshot.waiting[kind] = admitted - due_admitted.get(kind, 0)
                    if proposals:
                        snapshot.proposed[kind] = proposals
                cursor = await conn.execute(
                    rt.queries["blocked_lanes"], {**params, "limit": 100_000}
                )
                for row in await cursor.fetchall():
                    snapshot.lanes_blocked[row[0]] = snapshot.lanes_blocked.get(row[0], 0) + 1
                self._full_counted_at = time.monotonic()
                self._full_counts = (
                    dict(snapshot.waiting),
                    dict(snapshot.proposed),
                    dict(snapshot.lanes_blocked),
                )
            else:
                waiting, proposed, lanes_blocked = self._full_counts
                snapshot.waiting.update(waiting)
                snapshot.proposed.update(proposed)
                snapshot.lanes_blocked.update(lanes_blocked)
        rt.instruments.publish(snapshot)
        return snapshot

    async def sample_gauges(self) -> None:
        """The gauges, taking the full counts only every ``blocked_lanes_seconds``."""
        last = self._full_counted_at
        due = last is None or time.monotonic() - last >= self.rt.settings.blocked_lanes_seconds
        await self.sample_backlog(blocked=due)
