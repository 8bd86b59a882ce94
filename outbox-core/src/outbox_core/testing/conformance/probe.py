"""The probe around the adapter under test, and the capture of the log records.

The probe is a subclass of the registered adapter class, registered in its place for the test
(so the real executor, ``drain`` and ``cancel`` all use it). It records every attempt, every
``begin_write()`` (with how many writes the provider held at that moment), every ``ended`` call
(with the provider requests counted around it) and every request that reached the provider
while ``attempt.transaction()`` was open. Its fence can be told to fail: ``refuse`` (another
claim moves the epoch just before the real fence, which then refuses), ``raise`` (the fence's
database connection breaks: an exception before the fence) and ``crash`` (the real fence
passes, then the process dies before the provider call: the attempt is cancelled and its
ending never written).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg import AsyncConnection

from ...action import Action
from ...adapter import ActionAdapter
from ...attempt import ActionAttempt, AttemptBackend, FenceAnswer
from ...requests import ActionRequest
from ...results import AdapterResult
from ...states import ActionState
from .target import LoopbackProvider

FenceMode = Literal["refuse", "raise", "crash"]


class FenceBroken(Exception):
    """Raised at ``begin_write()`` by the suite's fault switch: the fence's database connection
    broke before the fence was set (an exception before the fence)."""


@dataclass
class FenceCall:
    action_id: int
    attempt: int
    writes_before: int
    passed: bool | None  # None: the fence raised


@dataclass
class AttemptRecord:
    action_id: int
    number: int
    write_started: bool
    result: AdapterResult | BaseException | None = None
    crashed: bool = False


@dataclass
class EndedRecord:
    action_id: int
    state: ActionState
    stop_reason: str | None
    provider_requests: int


@dataclass
class Recorder:
    """What the probe saw, and the faults it was told to inject."""

    provider: LoopbackProvider
    requests_by_id: dict[int, ActionRequest] = field(default_factory=dict)
    attempts: list[AttemptRecord] = field(default_factory=list)
    fences: list[FenceCall] = field(default_factory=list)
    endings: list[EndedRecord] = field(default_factory=list)
    in_transaction: list[tuple[int, int]] = field(default_factory=list)
    fence_faults: list[FenceMode] = field(default_factory=list)
    crash_after_execute: bool = False
    instances: list[ActionAdapter] = field(default_factory=list)
    move_epoch: Callable[[int], Any] | None = None

    def writes(self, action_id: int) -> int:
        request = self.requests_by_id.get(action_id)
        return 0 if request is None else self.provider.writes(request)

    async def execute(
        self,
        inner: Callable[[Any, ActionAttempt], Any],
        adapter: ActionAdapter,
        attempt: ActionAttempt,
    ) -> AdapterResult:
        if not any(known is adapter for known in self.instances):
            self.instances.append(adapter)
        attempt._backend = ProbeBackend(attempt._backend, self, attempt)
        record = AttemptRecord(attempt.id, attempt.number, attempt.write_started)
        self.attempts.append(record)
        try:
            result: AdapterResult = await inner(adapter, attempt)
        except BaseException as exc:
            record.result = exc
            raise
        record.result = result
        if self.crash_after_execute:
            # The provider call returned; the process dies before the ending is written.
            self.crash_after_execute = False
            record.crashed = True
            raise asyncio.CancelledError("the conformance suite's crash after the attempt")
        return result

    async def ended(
        self,
        inner: Callable[[Any, AsyncConnection[Any], Action], Any],
        adapter: ActionAdapter,
        conn: AsyncConnection[Any],
        action: Action,
    ) -> None:
        before = self.provider.requests()
        try:
            await inner(adapter, conn, action)
        finally:
            self.endings.append(
                EndedRecord(
                    action.id, action.state, action.stop_reason, self.provider.requests() - before
                )
            )


class ProbeBackend:
    """The attempt's backend (the executor), watched and with the fault switch at the fence."""

    def __init__(self, inner: AttemptBackend, recorder: Recorder, attempt: ActionAttempt) -> None:
        self._inner = inner
        self._recorder = recorder
        self._attempt = attempt

    async def begin_write(self, action_id: int, epoch: int) -> FenceAnswer:
        recorder = self._recorder
        mode = recorder.fence_faults.pop(0) if recorder.fence_faults else None
        call = FenceCall(action_id, self._attempt.number, recorder.writes(action_id), None)
        recorder.fences.append(call)
        if mode == "raise":
            raise FenceBroken("the conformance suite broke the fence's connection (on purpose)")
        if mode == "refuse" and recorder.move_epoch is not None:
            await recorder.move_epoch(action_id)
        answer = await self._inner.begin_write(action_id, epoch)
        call.passed = answer == "passed"
        if mode == "crash" and call.passed:
            raise asyncio.CancelledError("the conformance suite's crash after the fence")
        return answer

    def lease_transaction(
        self, action_id: int, epoch: int
    ) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        return self._watched(action_id, epoch)

    @asynccontextmanager
    async def _watched(self, action_id: int, epoch: int) -> AsyncIterator[AsyncConnection[Any]]:
        provider = self._recorder.provider
        async with self._inner.lease_transaction(action_id, epoch) as conn:
            before = provider.requests()
            try:
                yield conn
            finally:
                during = provider.requests() - before
                if during:
                    self._recorder.in_transaction.append((action_id, during))


def probe_class(adapter: type[ActionAdapter], recorder: Recorder) -> type[ActionAdapter]:
    """A subclass of ``adapter`` that reports to ``recorder``; it changes nothing else."""

    async def execute(self: ActionAdapter, attempt: ActionAttempt) -> AdapterResult:
        return await recorder.execute(adapter.execute, self, attempt)

    async def ended(self: ActionAdapter, conn: AsyncConnection[Any], action: Action) -> None:
        await recorder.ended(adapter.ended, self, conn, action)

    namespace = {
        "__module__": adapter.__module__,
        "__qualname__": adapter.__qualname__,
        "__doc__": adapter.__doc__,
        "execute": execute,
        "ended": ended,
    }
    return type(adapter.__name__, (adapter,), namespace)


class LogCapture(logging.Handler):
    """Every record that the outbox's and the adapter's loggers emit, at every level."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._names = list(dict.fromkeys(names))
        self._levels: dict[str, int] = {}
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @contextmanager
    def installed(self) -> Iterator[LogCapture]:
        root = logging.getLogger()
        for name in self._names:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(logging.DEBUG)
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)

    def holding(self, needle: str) -> list[str]:
        """The records (their event name or message) that contain ``needle`` anywhere: the
        message, its arguments, an attribute or the formatted exception."""
        found = []
        for record in self.records:
            texts = [record.getMessage(), repr(record.args)]
            texts.extend(f"{key}={value!r}" for key, value in vars(record).items())
            if record.exc_info:
                texts.append(self._formatter.formatException(record.exc_info))
            if any(needle in text for text in texts):
                found.append(str(getattr(record, "event", record.getMessage()[:80])))
        return found
