"""The executor: claims lane heads, runs attempts, fences writes, writes endings.

Leaderless: every replica runs the same loops, and every statement is safe when two replicas
run it at once (SKIP LOCKED lane locks, epoch conditions, batched deletes). The only code
that calls ``ActionAdapter.execute``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from ..action import Action
from ..adapter import ActionAdapter, check_built, egress_reset, egress_token
from ..attempt import ActionAttempt, ClaimedAction, FenceAnswer, LeaseLost
from ..errors import AdapterContractError, InvalidRequest
from ..observability import BacklogSnapshot, Instruments, Tally, action_event, event
from ..outbox import Outbox
from ..registry import KindFilter, RegisteredKind
from ..results import AdapterResult, Defer, Retry, StopReason
from ..settings import OutboxSettings
from ..states import ActionState
from .batcher import Batcher
from .jsonb import use_fast_loads
from .outcomes import AttemptFacts, Ending, decide, exception_result, wrong_result

ATTEMPT_OPS = frozenset({"claim", "reclaim"})
CLAIM_OPS = frozenset({"claim", "reclaim", "reap_lost", "reap_exhausted", "expire"})
_NO_FILTER = KindFilter(kinds=[], paths=[], suffixes=[])
_END_EVENT = {
    ActionState.DONE: "action.ended.done",
    ActionState.UNCERTAIN: "action.ended.uncertain",
    ActionState.FAILED: "action.ended.failed",
    ActionState.CANCELLED: "action.ended.cancelled",
}


class _HookFailed(Exception):
    pass


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
        self.outbox = outbox
        self.conninfo = conninfo
        self.settings = settings if settings is not None else outbox.settings
        registry = outbox.registry
        self.kinds = sorted(set(kinds)) if kinds is not None else registry.kinds
        self.entries: dict[str, RegisteredKind] = {kind: registry.get(kind) for kind in self.kinds}
        self.filter: KindFilter = registry.filter(self.kinds)
        self._adapters: dict[str, ActionAdapter] = dict(adapters or {})
        self.queries = outbox.queries
        self.instruments = Instruments.shared(self.kinds)
        self._tally = Tally()
        self.pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        parallel = self.settings.batches_in_flight
        # A fence's answer (passed, moved on, short of lease), or None while another transaction
        # holds the row.
        self._fencer: Batcher[tuple[int, int], FenceAnswer | None] = Batcher(
            self._flush_fences, parallel=parallel, name="outbox-fencer"
        )
        self._ender: Batcher[Ending, bool] = Batcher(
            self._flush_endings, parallel=parallel, name="outbox-ender"
        )
        self._running: set[asyncio.Task[None]] = set()
        self._held: dict[str, int] = {}
        self._kind_slots: dict[str, asyncio.Semaphore | None] = {}
        self._deadlines: dict[asyncio.Task[Any], float] = {}
        self._overdue: set[asyncio.Task[Any]] = set()
        self._watchdog_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._relower: dict[str, tuple[datetime | None, bool]] = {}
        self._relower_task: asyncio.Task[None] | None = None
        self._stopping = False
        # False once a shutdown stopped waiting for attempts: claims that still arrive (a batch
        # of endings written with chaining on, answering late) are left to their leases rather
        # than run on adapters that are being closed.
        self._accepting = True
        # Chained claims (see settle_v1) run only while the executor runs or drains, and
        # only for kinds without a slot limit (known once the adapters are built: open()).
        self._chaining = False
        self._plan_limits(lambda kind: self.entries[kind].adapter.max_concurrency)
        self._hooked: dict[str, bool] = {}
        self._blocked_counted_at: float | None = None
        self._lanes_blocked: dict[str, int] = {}
        # Action id -> the attempt number given back uncounted after a fence short of lease.
        self._short_given: dict[int, int] = {}
        # While drain() runs: the attempts whose execute() broke its contract, raised at the end.
        self._wrong_results: list[AdapterContractError] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        self._accepting = True
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
            await self.pool.open(wait=True, timeout=30)
        for kind in self.kinds:
            self.adapter(kind)
        self._plan_limits(lambda kind: self.adapter(kind).max_concurrency)
        if self._watchdog_task is None:
            self._watchdog_task = asyncio.create_task(self._watchdog(), name="outbox-watchdog")

    async def close(self) -> None:
        self._accepting = False
        await self._ender.close()
        await self._fencer.close()
        self._tally.flush()
        for kind, adapter in self._adapters.items():
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
        if self._relower_task is not None:
            self._relower_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._relower_task
            self._relower_task = None
        if self._relower and self.pool is not None:
            # One last try for the lanes still waiting to be lowered; a lane that another
            # transaction holds now waits for its next_at (at most a lease), as after a crash.
            wanted, self._relower = self._relower, {}
            try:
                async with self._pool().connection() as conn:
                    missed = await self._lower(conn, wanted)
            except psycopg.Error as exc:
                event("executor.relower.failed", level=logging.WARNING, error=type(exc).__name__)
            else:
                if missed:
                    event("executor.relower.left", level=logging.INFO, lanes=len(missed))
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    async def __aenter__(self) -> Executor:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _plan_limits(self, adapter_limit: Callable[[str], int | None]) -> None:
        """Which kinds have a slot limit (the settings' or the adapter's), and the filter of
        the chained claims, which leave those kinds to the claim loop."""
        unlimited = [
            kind
            for kind in self.kinds
            if not (self.settings.kind_concurrency.get(kind) or adapter_limit(kind))
        ]
        self._chain_filter = self.outbox.registry.filter(unlimited) if unlimited else None
        self._limited = frozenset(self.kinds) - set(unlimited)

    def adapter(self, kind: str) -> ActionAdapter:
        adapter = self._adapters.get(kind)
        if adapter is None:
            adapter = check_built(
                self.entries[kind].adapter, self.entries[kind].adapter.build(self.settings)
            )
            self._adapters[kind] = adapter
        return adapter

    def _pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        if self.pool is None:
            raise RuntimeError("the executor is not open: use `async with Executor(...)`")
        return self.pool

    # -- the loops -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run actions until ``stop`` is set; then stop claiming, let running attempts
        finish within ``shutdown_seconds`` and leave the rest to their leases."""
        await self.open()
        self._stopping = False
        self._chaining = True
        stopper = asyncio.create_task(stop.wait())
        loops = [
            asyncio.create_task(self._listen(), name="outbox-listen"),
            asyncio.create_task(self._claim_loop(), name="outbox-claim"),
            asyncio.create_task(self._maintenance_loop(), name="outbox-maintenance"),
        ]
        event("executor.started", kinds=",".join(self.kinds), concurrency=self.settings.concurrency)
        try:
            done, _ = await asyncio.wait([stopper, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self._stopping = True
            self._wake.set()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            stopper.cancel()
            left = await self._wait_running(self.settings.shutdown_seconds)
            self._chaining = False
            event("executor.stopped", left_to_leases=left)

    async def _wait_running(self, seconds: float) -> int:
        """Wait up to ``seconds`` for the running attempts and the endings being written, then
        cancel what still runs (left to its lease). A batch of endings that was written with
        chaining on may answer with the next heads of its lanes, already claimed: they start
        and are waited for too. Batches written after ``_stopping`` chain nothing, so this
        ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._running or self._ender.outstanding:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if self._running:
                await asyncio.wait(set(self._running), timeout=remaining)
            else:
                with suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._ender.idle()
        self._accepting = False
        pending = set(self._running)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    async def _listen(self) -> None:
        """LISTEN on a connection of its own (never the pool's) and wake the claim loop."""
        channel = sql.SQL("LISTEN {}").format(sql.Identifier(self.outbox.channel))
        backoff = 0.5
        while not self._stopping:
            try:
                async with await AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
                    await conn.execute(channel)
                    backoff = 0.5
                    self._wake.set()
                    async for _ in conn.notifies():
                        self._wake.set()
            except psycopg.OperationalError as exc:
                event("executor.listen.lost", level=logging.WARNING, error=type(exc).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _claim_loop(self) -> None:
        while not self._stopping:
            free = self.settings.concurrency - len(self._running) - self._ender.outstanding
            if free <= 0:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            limit = min(free, self.settings.claim_batch)
            self._wake.clear()
            more = False
            try:
                # One claim per kind that has a slot limit, bounded by its free slots: an
                # attempt never waits on its kind's slots while its lease runs down.
                for kinds, group_limit in self._claim_groups(limit):
                    rows, visited = await self._claim(group_limit, kinds)
                    self._dispatch(rows)
                    more = more or visited >= group_limit
                self._tally.flush()
            except psycopg.OperationalError as exc:
                event("executor.claim.failed", level=logging.WARNING, error=str(exc))
                await asyncio.sleep(1.0 + random.random())
                continue
            if more:
                continue
            poll = self.settings.poll_seconds * random.uniform(0.8, 1.2)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), poll)

    def _kind_limit(self, kind: str) -> int | None:
        return self.settings.kind_concurrency.get(kind) or self.adapter(kind).max_concurrency

    def _claim_groups(self, limit: int) -> list[tuple[list[str] | None, int]]:
        limited = {kind: cap for kind in self.kinds if (cap := self._kind_limit(kind))}
        if not limited:
            return [(None, limit)]
        groups: list[tuple[list[str] | None, int]] = []
        free = [kind for kind in self.kinds if kind not in limited]
        if free:
            groups.append((free, limit))
        for kind, cap in limited.items():
            room = min(limit, cap - self._held.get(kind, 0))
            if room > 0:
                groups.append(([kind], room))
        return groups

    async def _claim(
        self, limit: int, kinds: list[str] | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        chosen = self.filter if kinds is None else self.outbox.registry.filter(kinds)
        params = {
            "limit": limit,
            "lease": self.settings.lease_seconds,
            "kinds": chosen.kinds,
            "paths": chosen.paths,
            "suffixes": chosen.suffixes,
        }
        async with self._pool().connection() as conn:
            cursor = await conn.execute(self.queries["claim"], params, prepare=True)
            rows = await cursor.fetchall()
        visited = 0
        claimed = []
        for row in rows:
            if row[0] == "visited":
                visited = int(row[1])
            else:
                claimed.append(row)
        return claimed, visited

    def _dispatch(self, rows: Sequence[tuple[Any, ...]]) -> list[asyncio.Task[None]]:
        if not self._accepting:
            self._give_back(rows)
            return []
        started = []
        for row in rows:
            op = row[0]
            claimed = _claimed(row)
            if op in ATTEMPT_OPS:
                self._tally.add(self.instruments.claimed, ("kind", claimed.kind), ("op", op))
                action_event(
                    "action.claimed",
                    claimed.id,
                    claimed.kind,
                    level=logging.DEBUG,
                    epoch=claimed.epoch,
                    attempt=claimed.attempt,
                    op=op,
                )
                task = asyncio.create_task(
                    self._attempt(claimed), name=f"outbox-attempt-{claimed.id}"
                )
                if claimed.kind in self._limited:
                    self._held[claimed.kind] = self._held.get(claimed.kind, 0) + 1
                    task.add_done_callback(functools.partial(self._release, claimed.kind))
            else:
                task = asyncio.create_task(self._reap(op, row), name=f"outbox-reap-{claimed.id}")
            self._running.add(task)
            task.add_done_callback(self._finished)
            started.append(task)
        return started

    def _give_back(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Claims that arrived after a shutdown stopped waiting: not started. Each claimed
        action goes back to ADMITTED, due now, its attempt not counted (as a Defer), so another
        replica takes it at once; what cannot be given back is left to its lease."""
        returned = 0
        for row in rows:
            if row[0] not in ATTEMPT_OPS or not self._ender.accepting:
                continue
            claimed = _claimed(row)
            self._ender.post(self._deferral(claimed, self.adapter(claimed.kind), timedelta(0)))
            returned += 1
        if returned:
            event("executor.claims.returned", level=logging.INFO, actions=returned)
        if len(rows) > returned:
            event("executor.claims.left", level=logging.WARNING, actions=len(rows) - returned)

    def _release(self, kind: str, _task: asyncio.Task[None]) -> None:
        self._held[kind] -= 1
        self._wake.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._capacity.set()
        if not task.cancelled() and task.exception() is not None:
            event(
                "executor.task.failed",
                level=logging.ERROR,
                task=task.get_name(),
                error=repr(task.exception()),
            )

    # -- one attempt ---------------------------------------------------------------------------

    async def _attempt(self, claimed: ClaimedAction) -> None:
        # The lease began at the claim, before this task ran: the watchdog counts from here,
        # not from after a wait for the kind's slots.
        claimed_at = time.monotonic()
        entry = self.entries[claimed.kind]
        adapter = self.adapter(claimed.kind)
        try:
            body = entry.variants.decode(
                claimed.payload, claimed.idempotency_key, kind=claimed.kind
            )
        except InvalidRequest as exc:
            # The path filter let it through, so the kind and its variant are known; a payload
            # that still does not decode is not failed here (a newer build may own it).
            action_event(
                "action.undecodable", claimed.id, claimed.kind, level=logging.ERROR, error=str(exc)
            )
            await self._ender.submit(self._deferral(claimed, adapter, timedelta(minutes=5)))
            return
        attempt = ActionAttempt(claimed, self, body)
        slots = self._slots_for(claimed.kind)
        if slots is not None:
            await slots.acquire()
        started = time.perf_counter()
        result: AdapterResult | BaseException
        token = egress_token()
        task = asyncio.current_task()
        assert task is not None
        # The provider call must end inside the lease: the watchdog cancels an attempt that
        # outlives it (one timer for all attempts instead of one each).
        self._deadlines[task] = claimed_at + max(self.settings.lease_seconds - 1.0, 1.0)
        try:
            result = await adapter.execute(attempt)
        except asyncio.CancelledError:
            if task not in self._overdue:
                raise
            self._overdue.discard(task)
            result = TimeoutError(
                f"the attempt outlived its lease of {self.settings.lease_seconds} s"
            )
            task.uncancel()
        except Exception as exc:
            result = exc
            action_event(
                "action.attempt.raised",
                claimed.id,
                claimed.kind,
                level=logging.WARNING,
                error=type(exc).__name__,
                fenced=attempt.fenced,
            )
        finally:
            self._deadlines.pop(task, None)
            self._overdue.discard(task)  # also when the adapter swallowed the cancellation
            egress_reset(token)
            if slots is not None:
                slots.release()
        if isinstance(result, TimeoutError):
            action_event(
                "action.attempt.timed_out",
                claimed.id,
                claimed.kind,
                level=logging.WARNING,
                fenced=attempt.fenced,
            )
        elif not isinstance(result, BaseException):
            problem = wrong_result(result)
            if problem is not None:
                result = self._wrong_result(claimed, attempt, result, problem)
        self.instruments.duration.record(time.perf_counter() - started, {"kind": claimed.kind})
        facts = self._facts(claimed, adapter, fenced=attempt.fenced)
        ending = decide(facts, result)
        result_name = ending.result if ending is not None else "Abandoned"
        if isinstance(result, BaseException):
            result_name = f"{result_name} (raised)"
        self._tally.add(self.instruments.attempts, ("kind", claimed.kind), ("result", result_name))
        if ending is None:
            self._tally.add(self.instruments.fence_refused, ("kind", claimed.kind))
            if attempt.short_of_lease and not attempt.fenced:
                self._give_back_short(claimed, adapter)
                return
            action_event("action.abandoned", claimed.id, claimed.kind, epoch=claimed.epoch)
            return
        if self._short_given:
            self._short_given.pop(claimed.id, None)
        # Not awaited: the attempt's task ends here, and the ender reports a stale ending.
        self._ender.post(ending, self._ended_callback(ending))

    def _wrong_result(
        self, claimed: ClaimedAction, attempt: ActionAttempt, result: object, problem: str
    ) -> AdapterContractError:
        """What execute() returned is not a well-formed AdapterResult: a bug of this attempt,
        which ends as if execute() had raised (a Retry before the fence; after it a Reread, or
        UNCERTAIN for an at-most-once kind). drain() raises it in tests."""
        action_event(
            "action.attempt.wrong_result",
            claimed.id,
            claimed.kind,
            level=logging.ERROR,
            returned=type(result).__qualname__,
            problem=problem,
            fenced=attempt.fenced,
        )
        adapter = type(self.adapter(claimed.kind)).__qualname__
        error = AdapterContractError(f"action {claimed.id} ({claimed.kind}): {adapter}.{problem}")
        if self._wrong_results is not None:
            self._wrong_results.append(error)
        return error

    def _give_back_short(self, claimed: ClaimedAction, adapter: ActionAdapter) -> None:
        """The fence refused for its margin while the epoch was still this attempt's, and no
        fence of the attempt passed: nothing reached the provider. The action goes back at once
        (ADMITTED, due now, the attempt not counted: a Defer's write), so the next claim runs
        it with a whole lease instead of waiting out this one and spending an attempt.

        Once per attempt number (in this executor): when the same attempt comes back short
        again, its work before the fence outlasts what the lease leaves it, and an uncounted
        give-back would run it for ever. That one counts, as an exception before the write
        would, so the kind still ends ATTEMPTS_EXHAUSTED, without waiting out its leases."""
        counted = self._short_given.pop(claimed.id, None) == claimed.attempt
        action_event(
            "action.fence.short",
            claimed.id,
            claimed.kind,
            level=logging.WARNING,
            epoch=claimed.epoch,
            attempt=claimed.attempt,
            counted=counted,
            lease_seconds=self.settings.lease_seconds,
            margin_seconds=self.settings.fence_margin_seconds,
        )
        if counted:
            # As an exception before the write: a Retry after the kind's backoff (FAILED at the
            # last attempt), or a Reread when an earlier attempt's write may exist.
            facts = self._facts(claimed, adapter, fenced=False)
            counted_ending = decide(facts, exception_result(facts))
            assert counted_ending is not None  # a Retry or a Reread always writes
            ending = counted_ending
        else:
            self._short_given[claimed.id] = claimed.attempt
            ending = self._deferral(claimed, adapter, timedelta(0))
        self._ender.post(ending, self._ended_callback(ending))

    def _ended_callback(self, ending: Ending) -> Callable[[bool | BaseException], None]:
        def check(answer: bool | BaseException) -> None:
            self._capacity.set()  # an ending written frees a place for the claim loop
            if isinstance(answer, BaseException):
                action_event(
                    "action.end.failed",
                    ending.action_id,
                    ending.kind,
                    level=logging.ERROR,
                    error=repr(answer),
                )
            elif not answer:
                action_event(
                    "action.end.stale",
                    ending.action_id,
                    ending.kind,
                    level=logging.WARNING,
                    epoch=ending.epoch,
                    result=ending.result,
                )

        return check

    def _deferral(self, claimed: ClaimedAction, adapter: ActionAdapter, after: timedelta) -> Ending:
        """The ending that puts a claimed action back, unstarted: a Defer, not counted."""
        ending = decide(self._facts(claimed, adapter, fenced=False), Defer(after))
        assert ending is not None  # a Defer always reschedules
        return ending

    def _facts(
        self, claimed: ClaimedAction, adapter: ActionAdapter, *, fenced: bool
    ) -> AttemptFacts:
        # Positional: a named tuple built from keywords takes half as long again.
        return AttemptFacts(
            claimed.id,
            claimed.kind,
            claimed.lane_key,
            claimed.epoch,
            claimed.attempt,
            claimed.max_attempts,
            self.entries[claimed.kind].adapter.at_most_once,
            fenced,
            adapter.retry_base,
            adapter.retry_cap,
            claimed.write_started_at,
        )

    def _slots_for(self, kind: str) -> asyncio.Semaphore | None:
        """The kind's slots, or None without a kind limit: the claim's size already bounds
        what runs at once."""
        try:
            return self._kind_slots[kind]
        except KeyError:
            limit = self._kind_limit(kind)
            slots = asyncio.Semaphore(limit) if limit else None
            self._kind_slots[kind] = slots
            return slots

    async def _watchdog(self) -> None:
        """Cancel attempts that outlive their lease (checked every second)."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for task, deadline in list(self._deadlines.items()):
                if deadline <= now and task not in self._overdue:
                    self._overdue.add(task)
                    task.cancel()

    async def _reap(self, op: str, row: tuple[Any, ...]) -> None:
        """End an action the claim found past its lease or its expiry."""
        claimed = _claimed(row)
        state = ActionState(row[8])
        match op:
            case "reap_lost":
                target, reason = ActionState.UNCERTAIN, StopReason.LEASE_LOST_AFTER_WRITE
            case "reap_exhausted" if claimed.write_started_at is not None:
                target, reason = ActionState.UNCERTAIN, StopReason.ATTEMPTS_EXHAUSTED
            case "reap_exhausted":
                target, reason = ActionState.FAILED, StopReason.ATTEMPTS_EXHAUSTED
            case "expire":
                target, reason = ActionState.CANCELLED, StopReason.EXPIRED
            case _:
                raise AssertionError(op)
        ending = Ending(
            claimed.id,
            claimed.kind,
            claimed.lane_key,
            claimed.epoch,
            state,
            target,
            result=op,
            stop_reason=reason,
        )
        self._ender.post(ending, self._ended_callback(ending))

    # -- the write fence -----------------------------------------------------------------------

    async def begin_write(self, action_id: int, epoch: int) -> FenceAnswer:
        pause = 0.02
        while True:
            answer = await self._fencer.submit((action_id, epoch))
            if answer is not None:
                return answer
            # Another transaction holds the row (an erasure that will delete it, most often):
            # ask again, alone, without holding up the other fences; the margin refuses it
            # once too little of the lease is left.
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 1.0)

    async def _flush_fences(self, requests: Sequence[tuple[int, int]]) -> list[FenceAnswer | None]:
        margin = self.settings.fence_margin_seconds
        params = {
            "ids": [action_id for action_id, _ in requests],
            "epochs": [epoch for _, epoch in requests],
            "margin": margin,
        }
        async with self._pool().connection() as conn:
            # Planned for each batch, never prepared: a generic plan does not know the batch
            # size, and it chose to scan every executing action (through the partial index of
            # executing lanes) once for each fence: 120 us a fence with a thousand running.
            cursor = await conn.execute(self.queries["begin_write"], params, prepare=False)
            # id -> (None, False): passed; (seconds of lease left, False): refused for the
            # margin; (seconds left, True): busy, held by another transaction; not returned:
            # refused, the epoch moved on.
            rows = {row[0]: (row[1], row[2]) for row in await cursor.fetchall()}

        def answer(action_id: int) -> FenceAnswer | None:
            found = rows.get(action_id)
            if found is None:
                return "moved"
            left, busy = found
            if left is None:
                return "passed"
            if busy and left >= margin:
                return None
            return "short"

        return [answer(action_id) for action_id, _ in requests]

    @asynccontextmanager
    async def lease_transaction(
        self, action_id: int, epoch: int
    ) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._pool().connection() as conn:
            try:
                async with conn.transaction():
                    cursor = await conn.execute(
                        self.queries["hold_lease"], {"id": action_id, "epoch": epoch}
                    )
                    row = await cursor.fetchone()
                    if row is None:
                        raise LeaseLost(
                            f"action {action_id}: epoch {epoch} no longer holds it, or its lease "
                            "is over; nothing was written"
                        )
                    # The transaction holds the action's row, which a reclaim must wait for, so
                    # it may not outlive the lease, even if this process stalls: the server ends
                    # a statement, and the session of a transaction left idle, once the lease is
                    # over.
                    left = f"{max(int(row[0]), 1)}ms"
                    await conn.execute(
                        "SELECT set_config('statement_timeout', %(left)s, true),"
                        " set_config('idle_in_transaction_session_timeout', %(left)s, true)",
                        {"left": left},
                    )
                    yield conn
            except (
                psycopg.errors.IdleInTransactionSessionTimeout,
                psycopg.errors.QueryCanceled,
            ) as exc:
                raise LeaseLost(
                    f"action {action_id}: its lease ran out inside the transaction, which the "
                    f"server ended ({exc.diag.message_primary}); nothing was written"
                ) from exc

    # -- endings -------------------------------------------------------------------------------

    async def _flush_endings(self, endings: Sequence[Ending]) -> list[bool]:
        # A transient failure (a dropped connection, a deadlock, a failover) loses nothing:
        # every ending is conditional on its epoch and state, so writing it again is safe.
        for retry in range(5):
            try:
                return await self._flush_endings_once(endings)
            except psycopg.OperationalError as exc:
                event("executor.end.retry", level=logging.WARNING, error=str(exc), retry=retry)
                await asyncio.sleep(min(0.05 * 2**retry, 2.0))
        return await self._flush_endings_once(endings)

    async def _flush_endings_once(self, endings: Sequence[Ending]) -> list[bool]:
        try:
            changed = await self._write_endings(endings)
        except _HookFailed:
            if len(endings) == 1:
                return [False]
            answers = []
            for ending in endings:
                try:
                    answers.extend(await self._write_endings([ending]))
                except _HookFailed:
                    answers.append(False)
            return answers
        return changed

    async def _write_endings(self, endings: Sequence[Ending]) -> list[bool]:
        """One batch in one round trip (settle_v1); in an explicit transaction only when a kind
        of the batch has an ended()/rescheduled() hook to run in it."""
        chain = self._chaining and not self._stopping and self._chain_filter is not None
        chained_filter = self._chain_filter if chain and self._chain_filter else _NO_FILTER
        params = {
            "endings": _endings_json(endings),
            "chain": chain,
            "lease": self.settings.lease_seconds,
            "kinds": chained_filter.kinds,
            "paths": chained_filter.paths,
            "suffixes": chained_filter.suffixes,
        }
        by_id = {ending.action_id: ending for ending in endings}
        hooked = any(self._has_hooks(ending.kind) for ending in endings)
        params["brief"] = not hooked
        async with self._pool().connection() as conn:
            if hooked:
                async with conn.transaction():
                    cursor = await conn.execute(self.queries["settle"], params, prepare=True)
                    rows = await cursor.fetchall()
                    actions = [Action.from_row(row[1:21]) for row in rows if row[0] == "ended"]
                    await self._hooks(conn, actions, by_id)
            else:
                cursor = await conn.execute(self.queries["settle"], params, prepare=True)
                rows = await cursor.fetchall()
        # The attempt number of each action that changed, by id.
        changed: dict[int, int] = {}
        chained = []
        missed: dict[str, tuple[datetime | None, bool]] = {}
        lowered = False
        for row in rows:
            op = row[0]
            if op == "ended":
                if row[21] is not None:  # brief: every changed action in one row
                    changed.update(zip(row[21], row[22], strict=True))
                else:  # op, id, kind, ..., attempt (9), ...
                    changed[row[1]] = row[9]
            elif op in CLAIM_OPS:
                chained.append(_settled_as_claimed(row))
            elif op == "skipped":  # lane_key (4), at (12), cleared (19)
                missed[row[4]] = (row[12], row[19] == "cleared")
            elif op == "lowered":
                lowered = True
        for action_id, attempt in changed.items():
            self._report_ending(attempt, by_id[action_id])
        if chained:
            self._dispatch(chained)
        if missed:
            for key, wish in missed.items():
                self._relower[key] = _earlier(self._relower.get(key), *wish)
            self._schedule_relower()
        # The claim loop has something new to look at only where a freed lane was not chained:
        # lowered for any executor, or (chained) left to one of this executor's kinds with a
        # slot limit, which the chain's filter leaves out, and whose lane the chained claim
        # lowered to now. (A lane left to another executor's kind waits for its poll.)
        if lowered or (chain and self._limited and len(chained) < len(changed)):
            self._wake.set()
        self._tally.flush()
        return [ending.action_id in changed for ending in endings]

    def _has_hooks(self, kind: str) -> bool:
        hooked = self._hooked.get(kind)
        if hooked is None:
            adapter = type(self.adapter(kind))
            hooked = (
                adapter.ended is not ActionAdapter.ended
                or adapter.rescheduled is not ActionAdapter.rescheduled
            )
            self._hooked[kind] = hooked
        return hooked

    async def _hooks(
        self, conn: AsyncConnection[Any], actions: Sequence[Action], by_id: Mapping[int, Ending]
    ) -> None:
        for action in actions:
            adapter = self._adapters.get(action.kind) or self.adapter(action.kind)
            ending = by_id[action.id]
            try:
                if action.state.ended:
                    if type(adapter).ended is not ActionAdapter.ended:
                        await adapter.ended(conn, action)
                elif ending.result in ("Retry", "Defer") and (
                    type(adapter).rescheduled is not ActionAdapter.rescheduled
                ):
                    hint: Retry | Defer = (
                        Defer(ending.delay or timedelta(0), ending.event)
                        if ending.result == "Defer"
                        else Retry(ending.delay)
                    )
                    await adapter.rescheduled(conn, action, hint)
            except Exception as exc:
                action_event(
                    "action.ended.hook_failed",
                    action.id,
                    action.kind,
                    level=logging.ERROR,
                    error=repr(exc),
                    state=str(action.state),
                )
                raise _HookFailed from exc

    async def _lower(
        self, conn: AsyncConnection[Any], lanes: Mapping[str, tuple[datetime | None, bool]]
    ) -> dict[str, tuple[datetime | None, bool]]:
        """Lower the lanes' next look; return the ones another transaction held."""
        if not lanes:
            return {}
        keys = sorted(lanes)
        params = {
            "lanes": keys,
            "at": [lanes[key][0] for key in keys],
            "cleared": [lanes[key][1] for key in keys],
        }
        cursor = await conn.execute(self.queries["lower_lanes"], params, prepare=True)
        skipped = {row[0] for row in await cursor.fetchall()}
        return {key: lanes[key] for key in keys if key in skipped}

    def _schedule_relower(self) -> None:
        if self._relower_task is None or self._relower_task.done():
            self._relower_task = asyncio.create_task(self._relower_loop(), name="outbox-relower")

    async def _relower_loop(self) -> None:
        delay = 0.005
        while self._relower:
            await asyncio.sleep(delay)
            wanted, self._relower = self._relower, {}
            try:
                async with self._pool().connection() as conn:
                    missed = await self._lower(conn, wanted)
            except BaseException:
                # Cancelled (close() takes over) or failed: the lanes still wait to be lowered.
                for key, wish in wanted.items():
                    self._relower[key] = _earlier(self._relower.get(key), *wish)
                raise
            for key, wish in missed.items():
                self._relower.setdefault(key, wish)
            if len(missed) < len(wanted):
                self._wake.set()
            delay = min(delay * 2, 1.0)

    def _report_ending(self, attempt: int, ending: Ending) -> None:
        """Metrics and the log event of an ending that was written (the action's state, kind
        and stop reason are the ending's: settle wrote them)."""
        state = ending.state
        if state.ended:
            stop_reason = str(ending.stop_reason) if ending.stop_reason is not None else ""
            self._tally.add(
                self.instruments.ended,
                ("kind", ending.kind),
                ("state", state.value),
                ("stop_reason", stop_reason),
            )
            level = logging.WARNING if state is ActionState.UNCERTAIN else logging.INFO
            action_event(
                _END_EVENT[state],
                ending.action_id,
                ending.kind,
                level=level,
                stop_reason=stop_reason or None,
                attempt=attempt,
            )
        else:
            action_event(
                f"action.{ending.result.lower()}",
                ending.action_id,
                ending.kind,
                level=logging.DEBUG,
                state=str(state),
                attempt=attempt,
            )

    # -- run_now, drain and maintenance --------------------------------------------------------

    async def run_now(self, action_id: int) -> Action | None:
        """Claim and carry out one admitted lane head at once, fenced like any other claim.
        None when the action is not a claimable head (another replica may hold it)."""
        await self.open()
        params = {
            "id": action_id,
            "lease": self.settings.lease_seconds,
            "kinds": self.filter.kinds,
            "paths": self.filter.paths,
            "suffixes": self.filter.suffixes,
        }
        async with self._pool().connection() as conn:
            cursor = await conn.execute(self.queries["claim_action"], params)
            rows = await cursor.fetchall()
        # Wait for this action only: its attempt, then its ending's write (not for the other
        # attempts of a running executor, which may never all be done at once).
        started = self._dispatch([row for row in rows if row[0] != "visited"])
        await asyncio.gather(*started, return_exceptions=True)
        await self._ender.written(lambda ending: ending.action_id == action_id)
        self._tally.flush()
        if not any(row[1] == action_id and row[0] in ATTEMPT_OPS for row in rows):
            return None
        async with self._pool().connection() as conn:
            cursor = await conn.execute(self.queries["action_by_id"], {"id": action_id})
            row = await cursor.fetchone()
        return None if row is None else Action.from_row(row)

    async def drain(self, *, timeout: float = 60.0) -> int:
        """Make every waiting action due, then run until no action is due. Returns the number
        of attempts and endings run. For tests: the scheduler is off there. Raises
        :class:`AdapterContractError` at the end when an attempt's ``execute()`` returned what
        is not a well-formed ``AdapterResult`` (each such action was ended as if it raised)."""
        await self.open()
        deadline = time.monotonic() + timeout
        async with self._pool().connection() as conn:
            await conn.execute(self.queries["make_due"], self._filter_params())
        await self.sweep_expired()
        ran = 0
        self._chaining = True
        wrong: list[AdapterContractError] = []
        self._wrong_results = wrong
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"drain() did not finish within {timeout} s")
                # Kind by kind where a kind has a slot limit, as the run loop claims: an
                # attempt claimed beyond its kind's slots would wait for one while its lease
                # runs down.
                found = False
                for kinds, group_limit in self._claim_groups(self.settings.claim_batch):
                    rows, visited = await self._claim(group_limit, kinds)
                    self._dispatch(rows)
                    found = found or bool(rows) or visited > 0
                ran += await self.settle()
                if not found:
                    break
        finally:
            self._chaining = False
            self._wrong_results = None
        if wrong:
            # The actions were ended as if the adapter raised; the bug is the adapter's.
            raise AdapterContractError(
                f"drain(): {len(wrong)} attempt(s) broke the adapter contract; fix the adapter: "
                + "; ".join(str(error) for error in wrong)
            ) from wrong[0]
        return ran

    async def settle(self) -> int:
        """Wait until no attempt runs (chained claims may start more meanwhile) and every
        lane that waits to be lowered again was. Returns how many tasks finished."""
        finished = 0
        while self._running or self._ender.outstanding:
            batch = list(self._running)
            finished += len(batch)
            await asyncio.gather(*batch, return_exceptions=True)
            await self._ender.idle()
        if self._relower_task is not None:
            await self._relower_task
        self._tally.flush()
        return finished

    async def sweep_expired(self) -> int:
        """End admitted actions past their expiry anywhere in their lane (CANCELLED, EXPIRED)."""
        params = {"limit": 500, **self._filter_params()}
        async with self._pool().connection() as conn:
            cursor = await conn.execute(self.queries["expired_actions"], params)
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
        answers = await asyncio.gather(*(self._ender.submit(ending) for ending in endings))
        return sum(answers)

    async def sweep_retention(self) -> int:
        """Delete ended actions older than the retention, of the kinds that keep it."""
        kinds = [kind for kind, entry in self.entries.items() if entry.adapter.retained]
        keep = self.settings.retention_days * 86400.0
        deleted = 0
        async with self._pool().connection() as conn:
            for _ in range(100):
                cursor = await conn.execute(
                    self.queries["retention_delete"], {"keep": keep, "kinds": kinds}
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
        snapshot = BacklogSnapshot()
        params = self._filter_params()
        async with self._pool().connection() as conn, conn.transaction():
            # With a million rows the planner's cost passes the JIT threshold, and compiling
            # these scans took longer than running them (0.7 s of 1 s for blocked lanes).
            await conn.execute("SET LOCAL jit = off")
            cursor = await conn.execute(self.queries["backlog"], params)
            for kind, due, executing, oldest in await cursor.fetchall():
                snapshot.due[kind] = due
                snapshot.executing[kind] = executing
                snapshot.oldest_due_age[kind] = oldest
            cursor = await conn.execute(self.queries["uncertain_counts"], {"kinds": self.kinds})
            snapshot.uncertain.update(dict(await cursor.fetchall()))
            if blocked or self._blocked_counted_at is None:
                cursor = await conn.execute(
                    self.queries["blocked_lanes"], {**params, "limit": 100_000}
                )
                for row in await cursor.fetchall():
                    snapshot.lanes_blocked[row[0]] = snapshot.lanes_blocked.get(row[0], 0) + 1
                self._blocked_counted_at = time.monotonic()
                self._lanes_blocked = dict(snapshot.lanes_blocked)
            else:
                snapshot.lanes_blocked.update(self._lanes_blocked)
        self.instruments.publish(snapshot)
        return snapshot

    async def _sample_gauges(self) -> None:
        last = self._blocked_counted_at
        due = last is None or time.monotonic() - last >= self.settings.blocked_lanes_seconds
        await self.sample_backlog(blocked=due)

    def _filter_params(self) -> dict[str, Any]:
        return {
            "kinds": self.filter.kinds,
            "paths": self.filter.paths,
            "suffixes": self.filter.suffixes,
        }

    async def _maintenance_loop(self) -> None:
        period = self.settings.maintenance_seconds
        await asyncio.sleep(random.uniform(0, period))
        while not self._stopping:
            for step in (self.sweep_expired, self.sweep_retention, self._sample_gauges):
                try:
                    await step()
                except psycopg.Error as exc:
                    event(
                        "executor.maintenance.failed",
                        level=logging.WARNING,
                        step=step.__name__.lstrip("_"),
                        error=str(exc),
                    )
            self._tally.flush()
            await asyncio.sleep(period * random.uniform(0.8, 1.2))


def _earlier(
    known: tuple[datetime | None, bool] | None, at: datetime | None, cleared: bool
) -> tuple[datetime | None, bool]:
    """Merge two wishes for one lane: the earlier time (None is now), cleared if either is."""
    if known is None:
        return at, cleared
    earlier = None if known[0] is None or at is None else min(known[0], at)
    return earlier, known[1] or cleared


def _settled_as_claimed(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A settle_v1 row in the shape of a claim row (claimed_action_v1's columns)."""
    return (*row[:12], row[13], row[14], row[15], row[20])


def _claimed(row: tuple[Any, ...]) -> ClaimedAction:
    # row: op, id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
    #      state, attempt, max_attempts, epoch, expires_at, lease_until, write_started_at,
    #      created_at
    return ClaimedAction(
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
        row[15],
    )


def _endings_json(endings: Sequence[Ending]) -> str:
    """A batch of endings as the settle query takes it: one JSON object of aligned arrays."""
    return json.dumps(
        {
            "ids": [e.action_id for e in endings],
            "epochs": [e.epoch for e in endings],
            # States are StrEnums: json.dumps writes them as their values (without the enum's
            # slow .value lookup).
            "from_states": [e.from_state for e in endings],
            "states": [e.state for e in endings],
            "stop_reasons": [e.stop_reason for e in endings],
            "readback_refs": [e.readback_ref for e in endings],
            "delays": [e.delay.total_seconds() if e.delay is not None else 0.0 for e in endings],
            "fences": [e.fence for e in endings],
            "prior_writes": [
                e.prior_write.isoformat() if e.prior_write is not None else None for e in endings
            ],
            "uncounts": [e.uncount for e in endings],
            "results": [e.result for e in endings],
        }
    )
