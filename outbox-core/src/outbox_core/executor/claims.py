"""Claiming lane heads: the claim loop (woken by LISTEN or a jittered poll, bounded by the
free places and, per kind, by its free slots), and one claim statement (``claim_v1``, see
docs/design/claim.md). What a claim returns goes to the attempts, with each claimed action's
stored trace context while tracing is on. While the loop waits, the
producers are asked for wake-ups (waiting.py)."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from .. import tracing
from ..observability import event
from .attempts import Attempts
from .endings import Endings
from .runtime import Runtime
from .waiting import Waiting

# A claim group: the kinds it claims (None: every kind served) and how many at most.
ClaimGroup = tuple[list[str] | None, int]

LISTEN_RETRY_SECONDS = (0.5, 1.0)
"""After the LISTEN connection is lost: the first pause before connecting again, and the longest
(the pause doubles up to it). Short, because every second without LISTEN is start latency: after
a failover the new primary takes writes some seconds after the old one went away, and a pause
that had doubled to 8 or 16 s by then (the cap was 30 s) left each action enqueued meanwhile to
the poll (test_failover.py measured 7.6 s after an unplanned failover of 8 s). A refused connect
costs the server next to nothing."""


class Claims:
    def __init__(self, runtime: Runtime, attempts: Attempts, endings: Endings) -> None:
        self.rt = runtime
        self.attempts = attempts
        self.endings = endings
        self.waiting = Waiting(runtime)
        self._turn = 0
        """Which group of :meth:`round` goes first (counts the rounds)."""

    async def loop(self) -> None:
        """Claim while there is room, then wait for a wake-up or the poll."""
        rt = self.rt
        while not rt.stopping:
            free = (
                rt.settings.concurrency
                - len(self.attempts.running)
                - self.endings.batcher.outstanding
            )
            if free <= 0:
                rt.capacity.clear()
                await self.waiting.busy()
                await rt.capacity.wait()
                continue
            limit = min(free, rt.settings.claim_batch)
            rt.wake.clear()
            try:
                _, more = await self.round(limit)
                rt.claim_backlog = more
                rt.tally.flush()
            except psycopg.OperationalError as exc:
                event("executor.claim.failed", level=logging.WARNING, error=str(exc))
                await asyncio.sleep(1.0 + random.random())
                continue
            if more:
                await self.waiting.busy()
                continue
            await self.waiting.wait(rt.settings.poll_seconds * random.uniform(0.8, 1.2))

    async def listen(self) -> None:
        """LISTEN on a connection of its own (never the pool's) and wake the claim loop."""
        rt = self.rt
        # The server's pid in the same round trip (the statement still reads "LISTEN ..." in
        # pg_stat_activity): the row that asks producers for wake-ups names it.
        channel = sql.SQL("LISTEN {}; SELECT pg_backend_pid()").format(
            sql.Identifier(rt.outbox.channel)
        )
        first, most = LISTEN_RETRY_SECONDS
        backoff = first
        while not rt.stopping:
            try:
                async with await AsyncConnection.connect(rt.conninfo, autocommit=True) as conn:
                    cursor = await conn.execute(channel)
                    cursor.nextset()  # past LISTEN's result, to the pid's
                    pid = await cursor.fetchone()
                    backoff = first
                    self.waiting.listener_pid = int(pid[0]) if pid is not None else None
                    rt.wake.set()
                    async for _ in conn.notifies():
                        rt.wake.set()
            except psycopg.OperationalError as exc:
                self.waiting.listener_pid = None
                event(
                    "executor.listen.lost",
                    level=logging.WARNING,
                    error=type(exc).__name__,
                    retry_in=backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, most)

    async def round(self, limit: int) -> tuple[bool, bool]:
        """One claim round for ``limit`` places, group by group (:meth:`groups`), the places
        shared: each group claims at most what the groups before it left, so a round never
        starts more attempts than ``limit``. The group that goes first turns from round to
        round: under saturation the first group could take every place, and a kind with a slot
        limit would then never run while the others had work (nor they while it had).
        Returns whether it found anything (claimed, or looked at heads), and whether it left
        due lanes behind (a group that filled its share, or one it had no place left for)."""
        groups = self.groups(limit)
        if not groups:  # every kind has a slot limit, and none has a free slot
            return False, False
        first = self._turn % len(groups)
        self._turn += 1
        left, found, more = limit, False, False
        for kinds, group_limit in groups[first:] + groups[:first]:
            if left <= 0:
                more = True  # a group with no place left may have due lanes
                break
            share = min(group_limit, left)
            rows, visited = await self.claim(share, kinds)
            self.attempts.dispatch(rows)
            left -= len(rows)
            found = found or bool(rows) or visited > 0
            more = more or visited >= share
        return found, more

    def groups(self, limit: int) -> list[ClaimGroup]:
        """The claims to make for ``limit`` places: one for the kinds without a slot limit,
        one per kind with one, bounded by its free slots."""
        rt = self.rt
        limited = {kind: cap for kind in rt.kinds if (cap := rt.kind_limit(kind))}
        if not limited:
            return [(None, limit)]
        groups: list[ClaimGroup] = []
        free = [kind for kind in rt.kinds if kind not in limited]
        if free:
            groups.append((free, limit))
        for kind, cap in limited.items():
            room = min(limit, cap - self.attempts.held(kind))
            if room > 0:
                groups.append(([kind], room))
        return groups

    async def claim(
        self, limit: int, kinds: list[str] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One claim statement: the claimed rows, and how many heads it looked at."""
        rt = self.rt
        chosen = rt.filter if kinds is None else rt.outbox.registry.filter(kinds)
        params = {
            "limit": limit,
            "lease": rt.settings.lease_seconds,
            "kinds": chosen.kinds,
            "paths": chosen.paths,
            "suffixes": chosen.suffixes,
            "traced": tracing.enabled(),
        }
        async with rt.connection() as conn:
            cursor = await conn.execute(rt.queries["claim"], params, prepare=True)
            rows = await cursor.fetchall()
        visited = 0
        claimed = []
        for row in rows:
            if row[0] == "visited":
                visited = int(row[1])
            else:
                claimed.append(row)
        return claimed, visited

    async def claim_one(self, action_id: int) -> list[tuple[Any, ...]]:
        """Claim one named action if it is a claimable head (``run_now``)."""
        rt = self.rt
        params = {"id": action_id, "lease": rt.settings.lease_seconds, **rt.filter_params()}
        async with rt.connection() as conn:
            cursor = await conn.execute(rt.queries["claim_action"], params)
            rows = await cursor.fetchall()
        return [row for row in rows if row[0] != "visited"]
