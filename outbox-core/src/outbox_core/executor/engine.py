"""The executor: claims lane heads, runs attempts, fences writes, writes endings.

Leaderless: every replica runs the same loops, and every statement is safe when two replicas
run it at once (SKIP LOCKED lane locks, epoch conditions, batched deletes). Its parts, each
in a module named for its job:

- ``runtime``: what every part reads (settings, kinds, adapters, pool, counters, flags);
- ``claims``: the claim loop and the claim statement;
- ``attempts``: one task per claimed action, the kinds' slots, the watchdog;
- ``fences``: ``begin_write`` batched, and the attempt's lease transaction;
- ``endings``: the batched ending writes, their hooks, chained claims, lanes lowered again;
- ``maintenance``: expiry, retention, gauges.

This class wires them and runs them: ``run`` (the loops until stopped, then the shutdown),
``run_now`` (one action at once), ``run_due`` (what is due now, then return: ``outbox run
--once``), ``drain`` (tests: everything made due, run until nothing is due).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from contextlib import suppress
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from ..action import Action
from ..adapter import ActionAdapter
from ..errors import AdapterContractError
from ..observability import BacklogSnapshot, database_label, event
from ..outbox import Outbox
from ..settings import OutboxSettings
from ..startup import StoppedKind, acheck_sessions_waiting
from .attempts import ATTEMPT_OPS, Attempts
from .claims import Claims
from .endings import Endings
from .fences import Fences
from .maintenance import Maintenance
from .runtime import Runtime


def _by_plugin(rt: Runtime) -> str:
    """``outbox-email 0.1.0 (EMAIL); outbox-slack 0.1.0 (SLACK_POST)``: the kinds run, by the
    distribution (and version) that registered them."""
    groups: dict[str, list[str]] = {}
    for kind in rt.kinds:
        entry = rt.entries[kind]
        groups.setdefault(f"{entry.distribution} {entry.version}".strip(), []).append(kind)
    return "; ".join(f"{owner} ({' '.join(kinds)})" for owner, kinds in sorted(groups.items()))


class Executor:
    """Carries out the actions of the kinds it serves (all registered kinds by default)."""

    def __init__(
        self,
        outbox: Outbox,
        conninfo: str,
        *,
        settings: OutboxSettings | None = None,
        kinds: Collection[str] | None = None,
        adapters: Mapping[str, ActionAdapter] | None = None,
    ) -> None:
        settings = settings if settings is not None else outbox.settings
        rt = self.rt = Runtime(outbox, conninfo, settings, kinds, adapters)
        self.fences = Fences(rt)
        self.endings = Endings(rt, chained=lambda rows: self.attempts.dispatch(rows))
        self.attempts = Attempts(rt, self.fences, self.endings)
        self.claims = Claims(rt, self.attempts, self.endings)
        self.maintenance = Maintenance(rt, self.endings)
        self._watchdog_task: asyncio.Task[None] | None = None
        self._sessions_checked = False

    @property
    def outbox(self) -> Outbox:
        return self.rt.outbox

    @property
    def settings(self) -> OutboxSettings:
        return self.rt.settings

    @property
    def kinds(self) -> list[str]:
        """The kinds this executor runs (those it serves, less those stopped when it opened)."""
        return self.rt.kinds

    @property
    def stopped(self) -> list[StoppedKind]:
        """The kinds it serves whose adapter could not be built when it opened."""
        return self.rt.stopped

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection[Any]] | None:
        return self.rt.pool

    def adapter(self, kind: str) -> ActionAdapter:
        """The kind's adapter, built from the settings on first use."""
        return self.rt.adapter(kind)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        rt = self.rt
        rt.accepting = True
        if not rt.kinds_started:
            rt.start_kinds()
        if not self._sessions_checked:
            # Once per executor, before anything listens or prepares: refused through a
            # transaction pooler (startup.py).
            await acheck_sessions_waiting(rt.conninfo, database_label(rt.conninfo))
            self._sessions_checked = True
        await rt.open_pool()
        rt.plan_limits(lambda kind: rt.adapter(kind).max_concurrency)
        if self._watchdog_task is None:
            self._watchdog_task = asyncio.create_task(
                self.attempts.watchdog(), name="outbox-watchdog"
            )

    async def close(self) -> None:
        rt = self.rt
        rt.accepting = False
        await self.endings.close()
        await self.fences.close()
        await self.attempts.traces.close()
        rt.tally.flush()
        for kind, adapter in rt.adapters.items():
            try:
                await adapter.aclose()
            except Exception as exc:
                event(
                    "executor.adapter_close.failed",
                    level=logging.WARNING,
                    kind=kind,
                    error=type(exc).__name__,
                )
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._watchdog_task
            self._watchdog_task = None
        await rt.close_pool()

    async def __aenter__(self) -> Executor:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- running ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run actions until ``stop`` is set; then stop claiming, let running attempts
        finish within ``shutdown_seconds`` and leave the rest to their leases."""
        rt = self.rt
        await self.open()
        rt.stopping = False
        rt.chaining = True
        stopper = asyncio.create_task(stop.wait())
        loops = [
            asyncio.create_task(self.claims.listen(), name="outbox-listen"),
            asyncio.create_task(self.claims.loop(), name="outbox-claim"),
            asyncio.create_task(self.maintenance.loop(), name="outbox-maintenance"),
            asyncio.create_task(
                rt.progress.loop(rt.settings.progress_seconds, lambda: len(self.attempts.running)),
                name="outbox-progress",
            ),
        ]
        from ..plugins import _version

        event(
            "executor.started",
            version=_version("outbox-core"),
            kinds=",".join(rt.kinds),
            plugins=_by_plugin(rt),
            stopped=",".join(kind.kind for kind in rt.stopped),
            database=database_label(rt.conninfo),
            schema=rt.outbox.schema,
            concurrency=rt.settings.concurrency,
        )
        try:
            done, _ = await asyncio.wait([stopper, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            rt.stopping = True
            rt.wake.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            stopper.cancel()
            left = await self._wait_running(rt.settings.shutdown_seconds)
            await self.claims.waiting.leave()
            rt.chaining = False
            event(
                "executor.stopped",
                kinds=",".join(rt.kinds),
                database=database_label(rt.conninfo),
                schema=rt.outbox.schema,
                left_to_leases=left,
            )

    async def _wait_running(self, seconds: float) -> int:
        """Wait up to ``seconds`` for the running attempts and the endings being written, then
        cancel what still runs (left to its lease). A batch of endings that was written with
        chaining on may answer with the next heads of its lanes, already claimed: they start
        and are waited for too. Batches written after ``stopping`` chain nothing, so this
        ends."""
        running, ender = self.attempts.running, self.endings.batcher
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while running or ender.outstanding:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if running:
                await asyncio.wait(set(running), timeout=remaining)
            else:
                with suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await ender.idle()
        self.rt.accepting = False
        pending = set(running)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    async def run_now(self, action_id: int) -> Action | None:
        """Claim and carry out one admitted lane head at once, fenced like any other claim.
        None when the action is not a claimable head (another replica may hold it)."""
        await self.open()
        rows = await self.claims.claim_one(action_id)
        # Wait for this action only: its attempt, then its ending's write (not for the other
        # attempts of a running executor, which may never all be done at once).
        started = self.attempts.dispatch(rows)
        await asyncio.gather(*started, return_exceptions=True)
        await self.endings.batcher.written(lambda ending: ending.action_id == action_id)
        # An ending whose hook raised is written again after a pause: wait for that too.
        await self.endings.retried(action_id)
        self.rt.tally.flush()
        if not any(row[1] == action_id and row[0] in ATTEMPT_OPS for row in rows):
            return None
        async with self.rt.connection() as conn:
            cursor = await conn.execute(self.rt.queries["action_by_id"], {"id": action_id})
            row = await cursor.fetchone()
        return None if row is None else Action.from_row(row)

    async def drain(self, *, timeout: float = 60.0) -> int:
        """Make every waiting action due, then run until no action is due. Returns the number
        of attempts and endings run. For tests: the scheduler is off there. Raises
        :class:`AdapterContractError` at the end when an attempt's ``execute()`` returned what
        is not a well-formed ``AdapterResult`` (each such action was ended as if it raised)."""
        rt = self.rt
        await self.open()
        deadline = time.monotonic() + timeout
        async with rt.connection() as conn:
            await conn.execute(rt.queries["make_due"], rt.filter_params())
        await self.maintenance.sweep_expired(full=True)
        # Counted as they start, not as settle() sees them finish: an attempt may end while a
        # later claim group is still being claimed, before settle() looks.
        started_before = self.attempts.started
        wrong: list[AdapterContractError] = []
        self.attempts.wrong_results = wrong
        try:
            await self._claim_until_none_due(deadline, f"drain() did not finish within {timeout} s")
        finally:
            self.attempts.wrong_results = None
        if wrong:
            # The actions were ended as if the adapter raised; the bug is the adapter's.
            raise AdapterContractError(
                f"drain(): {len(wrong)} attempt(s) broke the adapter contract; fix the adapter: "
                + "; ".join(str(error) for error in wrong)
            ) from wrong[0]
        return self.attempts.started - started_before

    async def run_due(self) -> dict[str, int]:
        """Run what is due now, then return (what ``outbox run --once`` runs): the expiry and
        retention sweeps once, then claim rounds, each settled, until a round finds nothing
        due; the due lane heads, the heads their endings make due, and the reclaims of expired
        leases run. Nothing is made due: an action whose due time is ahead (a ``not_before``,
        a backoff, a deferral) or whose Reread's lease still runs waits for a later run, and
        one that another executor holds is left to it. Returns what this call did, under the
        names of the ``executor.progress`` line: ``claimed``, ``done``, ``failed``,
        ``cancelled``, ``uncertain``, ``rescheduled`` (to run again later)."""
        rt = self.rt
        await self.open()
        before = rt.progress.counts()
        await self.maintenance.sweep_expired(full=True)
        await self.maintenance.sweep_retention()
        await self._claim_until_none_due(None, "")
        return {name: count - before[name] for name, count in rt.progress.counts().items()}

    async def _claim_until_none_due(self, deadline: float | None, late: str) -> None:
        """Claim rounds, each settled (chained claims on), until one finds nothing due; past
        ``deadline`` (monotonic), TimeoutError(``late``)."""
        rt = self.rt
        rt.chaining = True
        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(late)
                # Kind by kind where a kind has a slot limit, as the run loop claims: an
                # attempt claimed beyond its kind's slots would wait for one while its lease
                # runs down.
                found, _ = await self.claims.round(rt.settings.claim_batch)
                await self.settle()
                if not found:
                    break
        finally:
            rt.chaining = False

    async def settle(self) -> int:
        """Wait until no attempt runs (chained claims may start more meanwhile) and every
        lane that waits to be lowered again was. Returns how many tasks finished."""
        running, ender = self.attempts.running, self.endings.batcher
        finished = 0
        while running or ender.outstanding:
            batch = list(running)
            finished += len(batch)
            await asyncio.gather(*batch, return_exceptions=True)
            await ender.idle()
        await self.endings.relowered()
        self.rt.tally.flush()
        return finished

    # -- maintenance, for callers that run it themselves -----------------------------------

    async def sweep_expired(self, *, full: bool = True) -> int:
        """End admitted actions past their expiry anywhere in their lane (CANCELLED, EXPIRED):
        every one, or with ``full=False`` those that came due since this executor's last sweep
        (as its maintenance loop does)."""
        return await self.maintenance.sweep_expired(full=full)

    async def sweep_retention(self) -> int:
        """Delete ended actions older than the retention, of the kinds that keep it."""
        return await self.maintenance.sweep_retention()

    async def sample_backlog(self, *, blocked: bool = True) -> BacklogSnapshot:
        """Count the backlog gauges and publish them (see Maintenance.sample_backlog)."""
        return await self.maintenance.sample_backlog(blocked=blocked)
