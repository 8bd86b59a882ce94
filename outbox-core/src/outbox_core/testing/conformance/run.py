"""One conformance check's run: the probe registered in place of the adapter, the logs
captured, the helpers the checks are written with, and the rules every run keeps."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import uuid
from typing import Any

from ...action import Action
from ...adapter import ActionAdapter
from ...errors import InvalidRequest
from ...executor.outcomes import clean_detail
from ...operator_changes import Resolution, change_many, written_or_refused
from ...requests import ActionRequest
from ...results import Defer, Failed, Reread
from ...states import ActionState
from .probe import (
    AttemptRecord,
    EndedRecord,
    FenceCall,
    FenceMode,
    LogCapture,
    Recorder,
    probe_class,
)
from .target import ConformanceFailure, ConformanceTarget, Fault, Profile

STOP_REASON_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,62}$")


class Run:
    """One check: the probe registered in place of the adapter, the logs captured, and the
    helpers the checks are written with."""

    def __init__(self, target: ConformanceTarget) -> None:
        self.target = target
        self.db = target.db
        self.kind = target.kind
        self.provider = target.provider
        entry = self._entry = self.db.registry.get(self.kind)
        self.adapter = entry.adapter
        self.profile = Profile.of(self.adapter)
        self.recorder = Recorder(target.provider, move_epoch=self._move_epoch)
        self.canary = f"conformance-canary-{uuid.uuid4().hex[:12]}"
        self.probe = probe_class(self.adapter, self.recorder)
        self.stop_reasons = entry.stop_reasons
        package = self.adapter.__module__.split(".")[0]
        self.logs = LogCapture(["outbox", package])
        self._stack = contextlib.ExitStack()
        self._serial = 0

    def __enter__(self) -> Run:
        """Register the probe in the adapter's place and capture the logs, until the exit."""
        registry, entry = self.db.registry, self._entry
        registry.unregister(self.kind)
        registry.register(self.probe, distribution=entry.distribution, version=entry.version)
        # Undone last first: the probe out, the adapter back.
        self._stack.callback(
            registry.register,
            self.adapter,
            distribution=entry.distribution,
            version=entry.version,
        )
        self._stack.callback(registry.unregister, self.kind)
        self._stack.enter_context(self.logs.installed())
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self._stack.close()
        if kind is None:
            self.verify()

    # -- acting --------------------------------------------------------------------------------

    def request(self, label: str, **changes: Any) -> ActionRequest:
        self._serial += 1
        key = f"conformance:{label}:{self._serial}:{uuid.uuid4().hex[:8]}"
        request = self.target.request(key, self.canary)
        if request.kind != self.kind:
            raise ConformanceFailure(
                f"the target's request() made a {request.kind} request; it must make {self.kind}"
            )
        return dataclasses.replace(request, **changes) if changes else request

    def enqueue(self, label: str, **changes: Any) -> int:
        """Enqueue a valid request of the kind; its action id."""
        request = self.request(label, **changes)
        with self.db.connect() as conn:
            try:
                action_id = self.db.outbox.enqueue(conn, request).id
            except InvalidRequest as exc:
                raise ConformanceFailure(
                    f"enqueue refused the target's valid request ({exc}): request() must make "
                    "a request that variants() accepts"
                ) from exc
            conn.commit()
        self.recorder.requests_by_id[action_id] = request
        stored = self.db.scalar(
            "SELECT payload::text FROM {schema}.agent_action WHERE id = %s", (action_id,)
        )
        if self.canary not in str(stored):
            raise ConformanceFailure(
                "the target's request(key, canary) must put the canary string in the payload; "
                "without it the check that no log record holds a payload value sees nothing"
            )
        return action_id

    def drain(self, *, timeout: float = 60.0) -> None:
        try:
            self.db.drain(timeout=timeout)
        except TimeoutError as exc:
            raise ConformanceFailure(
                f"the executor did not get through the actions within {timeout} s: an attempt "
                "that the provider left without an answer must end on the adapter's own timeout "
                "(provider_timeout_seconds)"
            ) from exc

    def fault(self, fault: Fault) -> None:
        self.provider.fault(fault)

    def unreadable(self) -> bool:
        """Make every read-back of the provider fail until :meth:`readable`; False when the
        provider has no read of its own (its ``fault("unreadable")`` raised
        NotImplementedError)."""
        try:
            self.provider.fault("unreadable")
        except NotImplementedError:
            return False
        return True

    def readable(self) -> None:
        self.provider.clear_faults()

    def break_fence(self, mode: FenceMode) -> None:
        self.recorder.fence_faults.append(mode)

    def crash_after_the_attempt(self) -> None:
        self.recorder.crash_after_execute = True

    def end_lease(self, action_id: int) -> None:
        """The lease of a crashed attempt runs out (as it would after lease_seconds)."""
        self.db.execute(
            "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 second'"
            " WHERE id = %s AND state = 'EXECUTING'",
            (action_id,),
        )

    def pass_expiry(self, action_id: int) -> None:
        self.db.execute(
            "UPDATE {schema}.agent_action SET expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (action_id,),
        )

    def cancel(self, action_id: int) -> Action | None:
        async def cancel() -> Action | None:
            async with await self.db.aconnect() as conn:
                action = await self.db.outbox.acancel(conn, action_id)
                await conn.commit()
                return action

        return asyncio.run(cancel())

    def resolve(self, action_id: int, how: Resolution, ref: str | None = None) -> None:
        """An operator's resolution of an UNCERTAIN action (``outbox resolve``), committed."""

        async def resolve() -> None:
            async with await self.db.aconnect() as conn:
                plan = await change_many(
                    conn, self.db.outbox, [action_id], how, "conformance", "suite", ref=ref
                )
                written_or_refused(plan)

        asyncio.run(resolve())

    async def _move_epoch(self, action_id: int) -> None:
        """Another claim takes the action just before the attempt's fence: its lease is made to
        run out and a claim raises the epoch (as a second replica's would)."""
        async with await self.db.aconnect() as conn, conn.transaction():
            table = f'"{self.db.schema}".agent_action'
            await conn.execute(
                f"UPDATE {table} SET lease_until = now() - interval '1 second' WHERE id = %s",
                (action_id,),
            )
            await conn.execute(
                f"UPDATE {table} SET epoch = epoch + 1, attempt = attempt + 1,"
                " lease_until = now() + interval '1 hour' WHERE id = %s",
                (action_id,),
            )

    # -- reading -------------------------------------------------------------------------------

    def state(self, action_id: int) -> tuple[ActionState, str | None, int, bool]:
        """(state, stop reason, attempts counted, write started) of the action."""
        row = self.db.rows(
            "SELECT state, stop_reason, attempt, write_started_at IS NOT NULL"
            " FROM {schema}.agent_action WHERE id = %s",
            (action_id,),
        )
        if not row:
            raise ConformanceFailure(f"action {action_id} is gone")
        state, reason, attempt, started = row[0]
        return ActionState(state), reason, attempt, started

    def writes(self, action_id: int) -> int:
        return self.recorder.writes(action_id)

    def attempts_of(self, action_id: int) -> list[AttemptRecord]:
        return [record for record in self.recorder.attempts if record.action_id == action_id]

    def fences_of(self, action_id: int) -> list[FenceCall]:
        return [call for call in self.recorder.fences if call.action_id == action_id]

    def endings_of(self, action_id: int) -> list[EndedRecord]:
        return [ending for ending in self.recorder.endings if ending.action_id == action_id]

    def expect(self, condition: bool, rule: str, detail: str = "") -> None:
        if not condition:
            kind = f"{self.kind} ({self.profile})"
            raise ConformanceFailure(f"{kind}: {rule}" + (f": {detail}" if detail else ""))

    # -- the rules every run keeps -------------------------------------------------------------

    def verify(self) -> None:
        """The rules that hold in every run, whatever the check provoked."""
        self.verify_fences()
        self.verify_no_request_in_transaction()
        self.verify_ended_calls_no_provider()
        self.verify_stop_reasons()
        self.verify_logs()
        self.verify_details()
        self.verify_results_carry_details()

    def verify_fences(self) -> None:
        for action_id in self.recorder.requests_by_id:
            fences = self.fences_of(action_id)
            if self.profile is Profile.NOTHING_OUTSIDE:
                self.expect(
                    not fences,
                    "a kind that writes nothing outside calls no begin_write()",
                    f"action {action_id} fenced {len(fences)} time(s); declare "
                    "writes_outside = True (the default) if the call writes something",
                )
                continue
            if fences:
                self.expect(
                    fences[0].writes_before == 0,
                    "begin_write() comes before any provider write",
                    f"the provider already held {fences[0].writes_before} write(s) of action "
                    f"{action_id} when its first begin_write() was called",
                )
            else:
                self.expect(
                    self.writes(action_id) == 0,
                    "begin_write() comes before any provider write",
                    f"the provider holds {self.writes(action_id)} write(s) of action {action_id} "
                    "and no begin_write() was ever called for it",
                )

    def verify_no_request_in_transaction(self) -> None:
        for action_id, requests in self.recorder.in_transaction:
            self.expect(
                False,
                "no provider request while attempt.transaction() is open",
                f"{requests} request(s) reached the provider inside the transaction of action "
                f"{action_id}; call the provider before or after it",
            )

    def verify_ended_calls_no_provider(self) -> None:
        for ending in self.recorder.endings:
            self.expect(
                ending.provider_requests == 0,
                "ended() calls no provider",
                f"{ending.provider_requests} request(s) reached the provider while ended() ran "
                f"for action {ending.action_id} ({ending.state})",
            )

    def verify_stop_reasons(self) -> None:
        rows = self.db.rows(
            "SELECT DISTINCT stop_reason FROM {schema}.agent_action"
            " WHERE kind = %s AND stop_reason IS NOT NULL",
            (self.kind,),
        )
        undeclared = sorted({row[0] for row in rows} - self.stop_reasons)
        self.expect(
            not undeclared,
            "the adapter's stop reasons are declared",
            f"{undeclared} ended actions but are neither core stop reasons nor in "
            f"{self.adapter.__qualname__}.stop_reasons",
        )

    def verify_logs(self) -> None:
        holding = self.logs.holding(self.canary)
        self.expect(
            not holding,
            "no payload value appears in a log record",
            f"the payload's canary string is in {len(holding)} record(s): {holding[:5]}",
        )

    def verify_details(self) -> None:
        """A result's detail is kept on the action for operators (outbox_core.results): it
        never holds a payload value."""
        rows = self.db.rows(
            "SELECT id, last_detail FROM {schema}.agent_action"
            " WHERE kind = %s AND strpos(last_detail, %s) > 0",
            (self.kind, self.canary),
        )
        self.expect(
            not rows,
            "no payload value appears in a result's detail",
            f"the payload's canary string is in the last_detail of action(s) "
            f"{[row[0] for row in rows][:5]}",
        )

    def verify_results_carry_details(self) -> None:
        """Every Reread, Defer and Failed the adapter returned says what the attempt saw: the
        action keeps it as ``last_detail``, the one thing an operator reads about an action
        that waits on a read-back or ended without its effect."""
        bare = [
            f"{type(record.result).__name__} of action {record.action_id}"
            for record in self.recorder.attempts
            if isinstance(record.result, Reread | Defer | Failed)
            and clean_detail(record.result.detail) is None
        ]
        self.expect(
            not bare,
            "every Reread, Defer and Failed carries a detail",
            f"{', '.join(bare[:5])} came without one: say what the attempt saw, with the "
            "provider's code (detail='conversations.history HTTP 503: not read')",
        )


def misnamed_stop_reasons(adapter: type[ActionAdapter]) -> list[str]:
    """The adapter's declared stop reasons that are not upper-case names."""
    return sorted(str(r) for r in adapter.stop_reasons if not STOP_REASON_NAME.match(str(r)))
