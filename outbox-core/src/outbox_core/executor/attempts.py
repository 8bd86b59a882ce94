"""Running what a claim returned: one task per claimed action (an attempt through its adapter,
or the ending of an action the claim found past its lease or expiry), the kinds' slots, and
the watchdog that cancels an attempt outliving its lease. The only code that calls
``ActionAdapter.execute``."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from .. import tracing
from ..adapter import ActionAdapter, egress_reset, egress_token
from ..attempt import ActionAttempt
from ..claimed import ClaimedAction
from ..errors import AdapterContractError, InvalidRequest
from ..observability import action_event, event
from ..results import AdapterResult, Defer, StopReason
from ..states import ActionState
from .endings import Endings
from .fences import Fences
from .outcomes import AttemptFacts, Ending, decide, exception_result, wrong_result
from .runtime import Runtime
from .traces import TraceContext, TraceContexts

# The claim's ops that start an attempt; the others end the action (see _reap).
ATTEMPT_OPS = frozenset({"claim", "reclaim"})
# How many actions given back short of lease an executor remembers (see _give_back_short).
_SHORT_GIVEN_KEPT = 10_000


class Attempts:
    def __init__(self, runtime: Runtime, fences: Fences, endings: Endings) -> None:
        self.rt = runtime
        self.fences = fences
        self.endings = endings
        self.traces = TraceContexts(runtime)
        self.running: set[asyncio.Task[None]] = set()
        # Every task started (attempts and endings of reaped or expired actions), for drain().
        self.started = 0
        self._held: dict[str, int] = {}
        self._kind_slots: dict[str, asyncio.Semaphore | None] = {}
        self._deadlines: dict[asyncio.Task[Any], float] = {}
        self._overdue: set[asyncio.Task[Any]] = set()
        # Action id -> the attempt number given back uncounted after a fence short of lease.
        self._short_given: dict[int, int] = {}
        # While drain() runs: the attempts whose execute() broke its contract, raised at the end.
        self.wrong_results: list[AdapterContractError] | None = None
        # The lease every claim of this executor asks for, made once (a timedelta an attempt
        # was 1 % of its CPU).
        self._lease = timedelta(seconds=runtime.settings.lease_seconds)

    def dispatch(self, rows: Sequence[tuple[Any, ...]]) -> list[asyncio.Task[None]]:
        """Start a task for each claimed row (claim_v1's rows, then the stored trace context:
        the claim query's); the tasks, to wait for."""
        rt = self.rt
        if not rt.accepting:
            self._give_back(rows)
            return []
        started = []
        # Once a batch: whether a tracer provider is configured (a look at os.environ while
        # none is) cost 2 % of an untraced attempt.
        traced = tracing.enabled()
        for row in rows:
            op = row[0]
            claimed = claimed_action(row)
            if op in ATTEMPT_OPS:
                rt.tally.add(rt.instruments.claimed, ("kind", claimed.kind), ("op", op))
                rt.progress.claimed += 1
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
                    self._attempt(claimed, row[16], traced), name=f"outbox-attempt-{claimed.id}"
                )
                if claimed.kind in rt.limited:
                    self._held[claimed.kind] = self._held.get(claimed.kind, 0) + 1
                    task.add_done_callback(functools.partial(self._release, claimed.kind))
            else:
                task = asyncio.create_task(self._reap(op, row), name=f"outbox-reap-{claimed.id}")
            self.running.add(task)
            task.add_done_callback(self._finished)
            started.append(task)
        self.started += len(started)
        return started

    def held(self, kind: str) -> int:
        """How many attempts of a kind with a slot limit run or wait for a slot."""
        return self._held.get(kind, 0)

    def _give_back(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Claims that arrived after a shutdown stopped waiting: not started. Each claimed
        action goes back to ADMITTED, due now, its attempt not counted (as a Defer), so another
        replica takes it at once; what cannot be given back is left to its lease."""
        returned = 0
        for row in rows:
            if row[0] not in ATTEMPT_OPS or not self.endings.batcher.accepting:
                continue
            claimed = claimed_action(row)
            ending = self._deferral(
                claimed,
                self.rt.adapter(claimed.kind),
                timedelta(0),
                "given back unstarted: the executor was stopping",
            )
            self.endings.batcher.post(ending)
            returned += 1
        if returned:
            event("executor.claims.returned", level=logging.INFO, actions=returned)
        if len(rows) > returned:
            event("executor.claims.left", level=logging.WARNING, actions=len(rows) - returned)

    def _release(self, kind: str, _task: asyncio.Task[None]) -> None:
        self._held[kind] -= 1
        self.rt.wake.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.rt.capacity.set()
        if not task.cancelled() and task.exception() is not None:
            event(
                "executor.task.failed",
                level=logging.ERROR,
                task=task.get_name(),
                error=repr(task.exception()),
            )

    # -- one attempt -----------------------------------------------------------------------

    async def _attempt(
        self, claimed: ClaimedAction, stored: TraceContext = None, traced: bool = False
    ) -> None:
        """One attempt. ``stored``: the trace context the claim returned with the row ('{}'
        when none was stored; None when the claim did not read it, see :meth:`_trace`);
        ``traced``: whether a tracer provider was configured when it was dispatched."""
        rt = self.rt
        # The lease began at the claim, before this task ran: the watchdog counts from here,
        # not from after a wait for the kind's slots.
        claimed_at = time.monotonic()
        entry = rt.entries[claimed.kind]
        adapter = rt.adapter(claimed.kind)
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
            await self.endings.submit(
                self._deferral(
                    claimed,
                    adapter,
                    timedelta(minutes=5),
                    "the payload does not decode with this build's model",
                )
            )
            return
        attempt = ActionAttempt(claimed, self.fences, body)
        slots = self._slots_for(claimed.kind)
        if slots is not None:
            await slots.acquire()
        activation = None
        if traced:
            if stored is None:  # the claim did not read it (see _trace)
                stored = await self.traces.read(attempt.id)
            activation = self._trace(attempt, stored)
        started = time.perf_counter()
        result: AdapterResult | BaseException
        token = egress_token()
        task = asyncio.current_task()
        assert task is not None
        # The provider call must end inside the lease: the watchdog cancels an attempt that
        # outlives it (one timer for all attempts instead of one each).
        self._deadlines[task] = claimed_at + max(rt.settings.lease_seconds - 1.0, 1.0)
        try:
            result = await adapter.execute(attempt)
        except asyncio.CancelledError:
            if task not in self._overdue:
                if attempt.span is not None:  # the executor is closing: nothing is decided
                    tracing.end_attempt(attempt.span, "Interrupted", None)
                raise
            self._overdue.discard(task)
            result = TimeoutError(
                f"the attempt outlived its lease of {rt.settings.lease_seconds} s"
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
            if activation is not None:
                tracing.deactivate(activation)
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
        rt.instruments.duration.record(time.perf_counter() - started, {"kind": claimed.kind})
        facts = self._facts(
            claimed, adapter, fenced=attempt.fenced, began_write=attempt.fenced or attempt.refused
        )
        ending = decide(facts, result)
        result_name = ending.result if ending is not None else "Abandoned"
        if isinstance(result, BaseException):
            result_name = f"{result_name} (raised)"
        rt.tally.add(rt.instruments.attempts, ("kind", claimed.kind), ("result", result_name))
        if attempt.span is not None:
            error = result if isinstance(result, BaseException) else None
            tracing.end_attempt(attempt.span, result_name, ending, error)
        if ending is None:
            rt.tally.add(rt.instruments.fence_refused, ("kind", claimed.kind))
            if attempt.short_of_lease and not attempt.fenced:
                self._give_back_short(claimed, adapter)
                return
            action_event("action.abandoned", claimed.id, claimed.kind, epoch=claimed.epoch)
            return
        if self._short_given:
            self._short_given.pop(claimed.id, None)
        # Not awaited: the attempt's task ends here, and the ender reports a stale ending.
        self.endings.post(ending)

    def _trace(self, attempt: ActionAttempt, stored: TraceContext) -> tracing.Activation | None:
        """Start the attempt's span, child of the context stored at enqueue, and make it the
        current span while execute() runs (so the provider client's spans nest under it); the
        token that detaches it. The claim returns the stored context with its row; only when
        it did not (the action was enqueued while the claim ran, or tracing was turned on
        since) has the caller read it first (:class:`TraceContexts`, which answers None when
        it cannot). A trace that cannot be started (a stored context written by hand that does
        not parse) never stops the attempt, which holds its kind's slot here and must reach its
        ending: it runs without a span."""
        try:
            attempt.span = tracing.start_attempt(attempt.action, stored)
            return tracing.activate(attempt.span)
        except Exception as exc:
            attempt.span = None
            action_event(
                "action.trace.failed",
                attempt.id,
                attempt.action.kind,
                level=logging.WARNING,
                error=type(exc).__name__,
            )
            return None

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
        adapter = type(self.rt.adapter(claimed.kind)).__qualname__
        error = AdapterContractError(f"action {claimed.id} ({claimed.kind}): {adapter}.{problem}")
        if self.wrong_results is not None:
            self.wrong_results.append(error)
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
            lease_seconds=self.rt.settings.lease_seconds,
            margin_seconds=self.rt.settings.fence_margin_seconds,
        )
        if counted:
            # As an exception before the write: a Retry after the kind's backoff (FAILED at the
            # last attempt), or a Reread when an earlier attempt's write may exist.
            # It called begin_write() (refused for the margin): a Reread of it counts too.
            facts = self._facts(claimed, adapter, fenced=False, began_write=True)
            counted_ending = decide(facts, exception_result(facts))
            assert counted_ending is not None  # a Retry or a Reread always writes
            ending = counted_ending
        else:
            self._short_given[claimed.id] = claimed.attempt
            # Another replica may take the action next and this one never hear of it again:
            # keep the newest entries only (at worst, one more uncounted give-back).
            while len(self._short_given) > _SHORT_GIVEN_KEPT:
                del self._short_given[next(iter(self._short_given))]
            ending = self._deferral(
                claimed, adapter, timedelta(0), "given back: less lease left than the fence margin"
            )
        self.endings.post(ending)

    def _deferral(
        self, claimed: ClaimedAction, adapter: ActionAdapter, after: timedelta, detail: str
    ) -> Ending:
        """The ending that puts a claimed action back, unstarted: a Defer, not counted."""
        facts = self._facts(claimed, adapter, fenced=False, began_write=False)
        ending = decide(facts, Defer(after, detail=detail))
        assert ending is not None  # a Defer always reschedules
        return ending

    def _facts(
        self, claimed: ClaimedAction, adapter: ActionAdapter, *, fenced: bool, began_write: bool
    ) -> AttemptFacts:
        # The claim's database time: every claim of this executor sets lease_until to its now()
        # plus the lease it asks for (claims.py, endings.py); no Python clock is compared with a
        # database time.
        lease_until = claimed.lease_until
        claimed_at = None if lease_until is None else lease_until - self._lease
        # Positional: a named tuple built from keywords takes half as long again.
        return AttemptFacts(
            claimed.id,
            claimed.kind,
            claimed.lane_key,
            claimed.epoch,
            claimed.attempt,
            claimed.max_attempts,
            self.rt.entries[claimed.kind].adapter.at_most_once,
            fenced,
            began_write,
            adapter.retry_base,
            adapter.retry_cap,
            adapter.reread_base,
            adapter.reread_cap,
            adapter.unreadable_for,
            claimed.write_started_at,
            claimed_at,
        )

    def _slots_for(self, kind: str) -> asyncio.Semaphore | None:
        """The kind's slots, or None without a kind limit: the claim's size already bounds
        what runs at once."""
        try:
            return self._kind_slots[kind]
        except KeyError:
            limit = self.rt.kind_limit(kind)
            slots = asyncio.Semaphore(limit) if limit else None
            self._kind_slots[kind] = slots
            return slots

    async def watchdog(self) -> None:
        """Cancel attempts that outlive their lease (checked every second)."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for task, deadline in list(self._deadlines.items()):
                if deadline <= now and task not in self._overdue:
                    self._overdue.add(task)
                    task.cancel()

    # -- an action the claim found past its lease or expiry -------------------------------

    async def _reap(self, op: str, row: tuple[Any, ...]) -> None:
        """End an action the claim found past its lease or its expiry."""
        claimed = claimed_action(row)
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
        self.endings.post(
            Ending(
                claimed.id,
                claimed.kind,
                claimed.lane_key,
                claimed.epoch,
                state,
                target,
                result=op,
                stop_reason=reason,
            )
        )


def claimed_action(row: tuple[Any, ...]) -> ClaimedAction:
    # row: op, id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
    #      state, attempt, max_attempts, epoch, expires_at, lease_until, write_started_at,
    #      created_at (then the claim query's trace context, not part of the action)
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
