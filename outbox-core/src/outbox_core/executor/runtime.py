"""What every part of the executor reads: its settings, the kinds it serves, their adapters,
the connection pool, the counters, and the few flags and events the parts signal each other
with. One instance per executor; the parts (claims, attempts, fences, endings, maintenance)
each hold it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from ..adapter import ActionAdapter, check_built
from ..observability import Instruments, Tally, event
from ..outbox import Outbox
from ..registry import KindFilter, RegisteredKind
from ..settings import OutboxSettings
from ..startup import OPEN_WAIT_SECONDS, StoppedKind, build_adapters, refusal
from .jsonb import use_fast_loads
from .progress import Progress


class Runtime:
    def __init__(
        self,
        outbox: Outbox,
        conninfo: str,
        settings: OutboxSettings,
        kinds: Collection[str] | None,
        adapters: Mapping[str, ActionAdapter] | None,
    ) -> None:
        self.outbox = outbox
        self.conninfo = conninfo
        self.settings = settings
        registry = outbox.registry
        self.served: list[str] = sorted(set(kinds)) if kinds is not None else registry.kinds
        """The kinds this executor serves (all registered kinds unless named), also those
        stopped when it opened."""
        self.kinds = list(self.served)
        """The kinds this executor runs: those it serves less those stopped when it opened."""
        self.entries: dict[str, RegisteredKind] = {kind: registry.get(kind) for kind in self.kinds}
        self.filter: KindFilter = registry.filter(self.kinds)
        self.served_filter = self.filter
        self.stopped: list[StoppedKind] = []
        """Kinds whose adapter could not be built when the executor opened (see startup.py)."""
        self.kinds_started = False
        self.adapters: dict[str, ActionAdapter] = dict(adapters or {})
        self.queries = outbox.queries
        self.instruments = Instruments.shared(self.kinds)
        self.tally = Tally()
        self.progress = Progress()
        self.pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        # Set when the claim loop has something new to look at (a notification, an ending
        # that freed a lane, a slot released); `capacity` when an attempt or ending finished.
        self.wake = asyncio.Event()
        self.capacity = asyncio.Event()
        # The executor is shutting down: no new claims, no chained claims.
        self.stopping = False
        # False once a shutdown stopped waiting for attempts: claims that still arrive (a batch
        # of endings written with chaining on, answering late) are given back or left to their
        # leases rather than run on adapters that are being closed.
        self.accepting = True
        # Chained claims (see settle_v2) run only while the executor runs or drains, and
        # only for kinds without a slot limit (known once the adapters are built: open()).
        self.chaining = False
        # The last claim round took as many lanes as it could and may have left due lanes
        # behind. Chaining then stops: a freed lane is lowered to now and queues behind them,
        # instead of keeping the place for its own next action (with every place taken, the
        # claim loop never had one, and a due lane outside the running ones waited until their
        # backlogs ran dry: issue 22's chaos run). Cleared by a round that saw every due lane.
        self.claim_backlog = False
        self.plan_limits(lambda kind: self.entries[kind].adapter.max_concurrency)

    # -- adapters and slot limits ----------------------------------------------------------

    def adapter(self, kind: str) -> ActionAdapter:
        """The kind's adapter, built from the settings on first use."""
        adapter = self.adapters.get(kind)
        if adapter is None:
            entry = self.entries[kind]
            adapter = check_built(entry.adapter, entry.adapter.build(self.settings))
            self.adapters[kind] = adapter
        return adapter

    def start_kinds(self) -> None:
        """Build the adapters of the served kinds; a kind whose adapter cannot be built is
        stopped (logged, gauged, its actions left queued), or refused with strict start-up."""
        pending = {kind: entry for kind, entry in self.entries.items() if kind not in self.adapters}
        built, stopped = build_adapters(pending, self.settings)
        if stopped and self.settings.strict_startup:
            raise refusal(stopped, strict=True)
        if stopped and len(stopped) == len(self.served):
            raise refusal(stopped, strict=False)
        self.adapters.update(built)
        for kind in stopped:
            event(
                "executor.kind.stopped",
                level=logging.ERROR,
                kind=kind.kind,
                distribution=kind.distribution,
                error=kind.error,
            )
        names = {kind.kind for kind in stopped}
        self.stopped = stopped
        self.kinds = [kind for kind in self.served if kind not in names]
        self.filter = self.outbox.registry.filter(self.kinds)
        self.instruments.publish_stopped(self.served, names)
        self.kinds_started = True

    def kind_limit(self, kind: str) -> int | None:
        return self.settings.kind_concurrency.get(kind) or self.adapter(kind).max_concurrency

    def plan_limits(self, adapter_limit: Callable[[str], int | None]) -> None:
        """Which kinds have a slot limit (the settings' or the adapter's), and the filter of
        the chained claims, which leave those kinds to the claim loop."""
        unlimited = [
            kind
            for kind in self.kinds
            if not (self.settings.kind_concurrency.get(kind) or adapter_limit(kind))
        ]
        self.chain_filter = self.outbox.registry.filter(unlimited) if unlimited else None
        self.limited = frozenset(self.kinds) - set(unlimited)

    # -- the pool --------------------------------------------------------------------------

    async def open_pool(self) -> None:
        if self.pool is None:
            self.pool = AsyncConnectionPool(
                self.conninfo,
                min_size=self.settings.pool_size,
                max_size=self.settings.pool_size,
                kwargs={"autocommit": True},
                configure=use_fast_loads,
                open=False,
                name="outbox-executor",
            )
            await self.pool.open(wait=True, timeout=OPEN_WAIT_SECONDS)

    async def close_pool(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A connection of the pool (``async with runtime.connection() as conn``)."""
        if self.pool is None:
            raise RuntimeError("the executor is not open: use `async with Executor(...)`")
        return self.pool.connection()

    def filter_params(self) -> dict[str, Any]:
        """The kind filter of every kind served, as the queries take it."""
        return self.filter.params()
