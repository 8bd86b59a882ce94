"""Writing endings: the conditional writes that end or reschedule actions, batched into one
``settle_v2`` statement per batch, with the adapters' ``ended``/``rescheduled`` hooks in the
same transaction, the metrics and log event of each ending, the next heads that a settle
claims on the way (handed to the attempts), and the lanes it could not lower (lowered again
here, in the background).

Longer than 450 lines on purpose: :class:`Endings` is one object whose parts share its state
(the places it chained or gave to the claim loop, the endings whose hook raised and their
tries, the lanes waiting to be lowered again): a failed batch takes back the places its write
counted and falls back to one write an ending, which the hook retry and the relowering also
go through. Split, each part would reach into the others' counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection

from .. import tracing
from ..action import Action
from ..adapter import has_own
from ..observability import action_event, event
from ..registry import KindFilter
from ..results import Defer, Retry
from ..states import ActionState
from .batcher import Batcher
from .outcomes import Ending
from .runtime import Runtime

CLAIM_OPS = frozenset({"claim", "reclaim", "reap_lost", "reap_exhausted", "expire"})
_NO_FILTER = KindFilter(kinds=[], paths=[], suffixes=[])
_END_EVENT = {
    ActionState.DONE: "action.ended.done",
    ActionState.UNCERTAIN: "action.ended.uncertain",
    ActionState.FAILED: "action.ended.failed",
    ActionState.CANCELLED: "action.ended.cancelled",
}
# A lane's wish to be looked at again: at that time (None: now), and whether its head cleared.
LaneWish = tuple[datetime | None, bool]
# The pauses before an ending whose ended()/rescheduled() hook raised is written again (a hook
# that takes a domain row under a short lock_timeout, which an application transaction holds
# for a moment). After the last one the ending is left to the action's lease, as before.
HOOK_RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
# While the claim rounds leave due lanes behind, one freed place in CLAIM_SHARE goes to the
# claim loop (its batch is not chained: its lanes are lowered, and the next round takes the
# earliest due lanes); the others are chained. Chaining none cost half the throughput (a
# claim round walks the due lanes in next_at order, a chained claim goes to known lanes);
# chaining all starved the lanes outside the running ones (docs/design/claim.md, "The bound").
CLAIM_SHARE = 4


class _HookFailed(Exception):
    pass


class Endings:
    def __init__(
        self, runtime: Runtime, chained: Callable[[Sequence[tuple[Any, ...]]], object]
    ) -> None:
        self.rt = runtime
        # Where the next heads that a settle claimed go (the attempts' dispatch).
        self._chained = chained
        self.batcher: Batcher[Ending, bool] = Batcher(
            self._flush, parallel=runtime.settings.batches_in_flight, name="outbox-ender"
        )
        self._relower: dict[str, LaneWish] = {}
        self._relower_task: asyncio.Task[None] | None = None
        self._hooked: dict[str, bool] = {}
        # Places freed while the claim rounds had a backlog: chained, and left to the claim loop.
        self._chained_places = 0
        self._given_places = 0
        # Endings whose hook raised, waiting to be written again: (when, ending), and how many
        # times each (action, epoch) was tried.
        self._hook_waiting: list[tuple[float, Ending]] = []
        self._hook_tries: dict[tuple[int, int], int] = {}
        self._hook_task: asyncio.Task[None] | None = None
        # Set after each round of the retry loop (see retried()).
        self._hook_round = asyncio.Event()

    def post(self, ending: Ending) -> None:
        """Write ``ending`` with the next batch, not waiting for it; a failed or stale write is
        logged."""
        self.batcher.post(ending, self._checked(ending))

    async def submit(self, ending: Ending) -> bool:
        """Write ``ending`` with the next batch; whether it changed the action."""
        return await self.batcher.submit(ending)

    async def close(self) -> None:
        if self._hook_task is not None:
            # Endings still waiting for their hook are left to their leases.
            self._hook_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._hook_task
            self._hook_task = None
        await self.batcher.close()
        if self._relower_task is not None:
            self._relower_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._relower_task
            self._relower_task = None
        if self._relower and self.rt.pool is not None:
            # One last try for the lanes still waiting to be lowered; a lane that another
            # transaction holds now waits for its next_at (at most a lease), as after a crash.
            wanted, self._relower = self._relower, {}
            try:
                async with self.rt.connection() as conn:
                    missed = await self._lower(conn, wanted)
            except psycopg.Error as exc:
                event("executor.relower.failed", level=logging.WARNING, error=type(exc).__name__)
            else:
                if missed:
                    event("executor.relower.left", level=logging.INFO, lanes=len(missed))

    async def relowered(self) -> None:
        """Wait until the lanes that wait to be lowered again were, and the endings whose hook
        raised were written again (or given up on)."""
        if self._relower_task is not None:
            await self._relower_task
        while self._hook_task is not None and not self._hook_task.done():
            await self._hook_task

    async def retried(self, action_id: int) -> None:
        """Wait until no ending of ``action_id`` whose hook raised waits to be written again
        (written, stale or given up on), not for the other actions' retries."""
        while any(key[0] == action_id for key in self._hook_tries):
            task = self._hook_task
            if task is None or task.done():
                return
            self._hook_round.clear()
            round_done = asyncio.ensure_future(self._hook_round.wait())
            try:
                await asyncio.wait({task, round_done}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                round_done.cancel()

    def _checked(self, ending: Ending) -> Callable[[bool | BaseException], None]:
        def check(answer: bool | BaseException) -> None:
            self.rt.capacity.set()  # an ending written frees a place for the claim loop
            if isinstance(answer, BaseException):
                action_event(
                    "action.end.failed",
                    ending.action_id,
                    ending.kind,
                    level=logging.ERROR,
                    error=repr(answer),
                )
            elif not answer and (ending.action_id, ending.epoch) not in self._hook_tries:
                action_event(
                    "action.end.stale",
                    ending.action_id,
                    ending.kind,
                    level=logging.WARNING,
                    epoch=ending.epoch,
                    result=ending.result,
                )

        return check

    # -- one batch -------------------------------------------------------------------------

    async def _flush(self, endings: Sequence[Ending]) -> list[bool]:
        # A transient failure (a dropped connection, a deadlock, a failover) loses nothing:
        # every ending is conditional on its epoch and state, so writing it again is safe.
        for retry in range(5):
            try:
                answers = await self._flush_once(endings)
            except psycopg.OperationalError as exc:
                event("executor.end.retry", level=logging.WARNING, error=str(exc), retry=retry)
                await asyncio.sleep(min(0.05 * 2**retry, 2.0))
            else:
                return answers if retry == 0 else await self._recognised(endings, answers)
        return await self._recognised(endings, await self._flush_once(endings))

    async def _recognised(self, endings: Sequence[Ending], answers: list[bool]) -> list[bool]:
        """After a lost reply, the endings that the written-again batch found already written
        by the lost one: reported here, once, as written (not as stale). The next heads that
        the lost batch claimed on the way are started, as its answer would have started them."""
        unchanged = [e for e, answer in zip(endings, answers, strict=True) if not answer]
        if not unchanged:
            return answers
        params = {
            "ids": [e.action_id for e in unchanged],
            "epochs": [e.epoch for e in unchanged],
            "states": [str(e.state) for e in unchanged],
            "results": [e.result for e in unchanged],
            "stop_reasons": [e.stop_reason for e in unchanged],
        }
        try:
            async with self.rt.connection() as conn:
                cursor = await conn.execute(self.rt.queries["written_endings"], params)
                written = dict(await cursor.fetchall())
                chained: list[tuple[Any, ...]] = []
                if written:
                    lanes = sorted({e.lane_key for e in endings})
                    cursor = await conn.execute(
                        self.rt.queries["lost_chained_claims"],
                        {"lanes": lanes, "ended": list(written)},
                    )
                    chained = await cursor.fetchall()
        except psycopg.OperationalError as exc:
            # The endings are written either way; only their report (and the chained heads,
            # left to their lease) is lost.
            event("executor.end.unrecognised", level=logging.WARNING, error=str(exc))
            return answers
        if chained:
            self._chained(chained)
        for ending in unchanged:
            if ending.action_id in written:
                self._report(written[ending.action_id], ending)
        self.rt.tally.flush()
        return [
            answer or e.action_id in written for e, answer in zip(endings, answers, strict=True)
        ]

    async def _flush_once(self, endings: Sequence[Ending]) -> list[bool]:
        try:
            return await self._write(endings)
        except _HookFailed:
            if len(endings) == 1:
                self._hook_failed(endings[0])
                return [False]
            # One hook failed: write the others one by one, so only its action waits. Each
            # with its own retries: a dropped connection on one must not write the whole batch
            # again, where the lost-reply recognition would take the endings already written
            # here for the lost reply's (reported again, their chained heads started again).
            answers = []
            for ending in endings:
                answers.extend(await self._flush([ending]))
            return answers

    def _hook_failed(self, ending: Ending) -> None:
        """Write ``ending`` again after a pause (its hook raised; the batch was written without
        it), a few times; then its lease decides, as for a lost ending."""
        key = (ending.action_id, ending.epoch)
        tries = self._hook_tries.get(key, 0)
        if tries >= len(HOOK_RETRY_DELAYS) or self.rt.stopping:
            self._hook_tries.pop(key, None)
            return
        self._hook_tries[key] = tries + 1
        self._hook_waiting.append((time.monotonic() + HOOK_RETRY_DELAYS[tries], ending))
        if self._hook_task is None or self._hook_task.done():
            self._hook_task = asyncio.create_task(self._hook_loop(), name="outbox-hook-retry")

    async def _hook_loop(self) -> None:
        while self._hook_waiting:
            await asyncio.sleep(
                max(0.0, min(at for at, _ in self._hook_waiting) - time.monotonic())
            )
            now = time.monotonic()
            ready = [ending for at, ending in self._hook_waiting if at <= now]
            self._hook_waiting = [(at, e) for at, e in self._hook_waiting if at > now]
            await asyncio.gather(*(self.submit(e) for e in ready), return_exceptions=True)
            for ending in ready:
                # Written, stale or given up on, unless its hook failed again and it waits.
                if not any(waiting is ending for _, waiting in self._hook_waiting):
                    self._hook_tries.pop((ending.action_id, ending.epoch), None)
            self._hook_round.set()

    async def _write(self, endings: Sequence[Ending]) -> list[bool]:
        """One batch in one round trip (settle_v2); in an explicit transaction only when a kind
        of the batch has an ended()/rescheduled() hook to run in it."""
        rt = self.rt
        may_chain = rt.chaining and not rt.stopping and rt.chain_filter is not None
        counted = may_chain and rt.claim_backlog  # _chains counts this batch's places
        chain = may_chain and self._chains(len(endings))
        chained_filter = rt.chain_filter if chain and rt.chain_filter else _NO_FILTER
        params = {
            "endings": _endings_json(endings),
            "chain": chain,
            "lease": rt.settings.lease_seconds,
            "kinds": chained_filter.kinds,
            "paths": chained_filter.paths,
            "suffixes": chained_filter.suffixes,
            "traced": chain and tracing.enabled(),
        }
        by_id = {ending.action_id: ending for ending in endings}
        hooked = any(self._has_hooks(ending.kind) for ending in endings)
        params["brief"] = not hooked
        try:
            async with rt.connection() as conn:
                if hooked:
                    async with conn.transaction():
                        cursor = await conn.execute(rt.queries["settle"], params, prepare=True)
                        rows = await cursor.fetchall()
                        actions = [Action.from_row(r[1:22]) for r in rows if r[0] == "ended"]
                        await self._hooks(conn, actions, by_id)
                else:
                    cursor = await conn.execute(rt.queries["settle"], params, prepare=True)
                    rows = await cursor.fetchall()
        except BaseException:
            # Written again (_flush's retries, or one by one after a hook failed), and decided
            # and counted again then: this try gave no place to anyone.
            if counted:
                self._uncount(chain, len(endings))
            raise
        # The attempt number of each action that changed, by id.
        changed: dict[int, int] = {}
        chained = []
        missed: dict[str, LaneWish] = {}
        lowered = False
        for row in rows:
            op = row[0]
            if op == "ended":
                if row[22] is not None:  # brief: every changed action in one row
                    changed.update(zip(row[22], row[23], strict=True))
                else:  # op, id, kind, ..., attempt (9), ...
                    changed[row[1]] = row[9]
            elif op in CLAIM_OPS:
                chained.append(_settled_as_claimed(row))
            elif op == "skipped":  # lane_key (4), at (12), cleared (19)
                missed[row[4]] = (row[12], row[19] == "cleared")
            elif op == "lowered":
                lowered = True
        for action_id, attempt in changed.items():
            self._report(attempt, by_id[action_id])
        if chained:
            self._chained(chained)
        if missed:
            for key, wish in missed.items():
                self._relower[key] = _earlier(self._relower.get(key), *wish)
            self._schedule_relower()
        # The claim loop has something new to look at only where a freed lane was not chained:
        # lowered for any executor, or (chained) left to one of this executor's kinds with a
        # slot limit, which the chain's filter leaves out, and whose lane the chained claim
        # lowered to now. (A lane left to another executor's kind waits for its poll.)
        if lowered or (chain and rt.limited and len(chained) < len(changed)):
            rt.wake.set()
        rt.tally.flush()
        return [ending.action_id in changed for ending in endings]

    def _chains(self, places: int) -> bool:
        """Whether a batch freeing ``places`` gives them to the next actions of its lanes:
        always while the last claim round took every due lane it saw; while it left due lanes
        behind, unless fewer than one place in CLAIM_SHARE went to the claim loop so far."""
        if not self.rt.claim_backlog:
            self._chained_places = self._given_places = 0
            return True
        if self._chained_places <= (CLAIM_SHARE - 1) * self._given_places:
            self._chained_places += places
            return True
        self._given_places += places
        return False

    def _uncount(self, chained: bool, places: int) -> None:
        """Take back what :meth:`_chains` counted for a batch whose write failed."""
        if chained:
            self._chained_places = max(0, self._chained_places - places)
        else:
            self._given_places = max(0, self._given_places - places)

    def _has_hooks(self, kind: str) -> bool:
        hooked = self._hooked.get(kind)
        if hooked is None:
            adapter = type(self.rt.adapter(kind))
            hooked = has_own(adapter, "ended") or has_own(adapter, "rescheduled")
            self._hooked[kind] = hooked
        return hooked

    async def _hooks(
        self, conn: AsyncConnection[Any], actions: Sequence[Action], by_id: Mapping[int, Ending]
    ) -> None:
        for action in actions:
            adapter = self.rt.adapter(action.kind)
            ending = by_id[action.id]
            try:
                if action.state.ended:
                    if has_own(type(adapter), "ended"):
                        await adapter.ended(conn, action)
                elif ending.result in ("Retry", "Defer") and (
                    has_own(type(adapter), "rescheduled")
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

    def _report(self, attempt: int, ending: Ending) -> None:
        """Metrics and the log event of an ending that was written (the action's state, kind
        and stop reason are the ending's: settle wrote them)."""
        state = ending.state
        self.rt.progress.count_ended(state)
        if state.ended:
            stop_reason = str(ending.stop_reason) if ending.stop_reason is not None else ""
            self.rt.tally.add(
                self.rt.instruments.ended,
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

    # -- lanes a settle could not lower ----------------------------------------------------

    async def _lower(
        self, conn: AsyncConnection[Any], lanes: Mapping[str, LaneWish]
    ) -> dict[str, LaneWish]:
        """Lower the lanes' next look; return the ones another transaction held."""
        if not lanes:
            return {}
        keys = sorted(lanes)
        params = {
            "lanes": keys,
            "at": [lanes[key][0] for key in keys],
            "cleared": [lanes[key][1] for key in keys],
        }
        cursor = await conn.execute(self.rt.queries["lower_lanes"], params, prepare=True)
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
                async with self.rt.connection() as conn:
                    missed = await self._lower(conn, wanted)
            except BaseException:
                # Cancelled (close() takes over) or failed: the lanes still wait to be lowered.
                for key, wish in wanted.items():
                    self._relower[key] = _earlier(self._relower.get(key), *wish)
                raise
            for key, wish in missed.items():
                self._relower.setdefault(key, wish)
            if len(missed) < len(wanted):
                self.rt.wake.set()
            delay = min(delay * 2, 1.0)


def _earlier(known: LaneWish | None, at: datetime | None, cleared: bool) -> LaneWish:
    """Merge two wishes for one lane: the earlier time (None is now), cleared if either is."""
    if known is None:
        return at, cleared
    earlier = None if known[0] is None or at is None else min(known[0], at)
    return earlier, known[1] or cleared


def _settled_as_claimed(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row of the settle query in the shape of a claim row (claimed_action_v1's columns, then
    the stored trace context)."""
    return (*row[:12], row[13], row[14], row[15], row[20], row[24])


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
            "details": [e.detail for e in endings],
        }
    )
