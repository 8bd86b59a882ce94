"""One attempt at one action, as its adapter sees it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from psycopg import AsyncConnection

from . import tracing
from .claimed import ClaimedAction
from .errors import OutboxError

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from pydantic import BaseModel


class LeaseLost(OutboxError):
    """The attempt's epoch moved on (another claim took the action, or it was erased): the
    attempt's domain transaction was not committed."""


FenceAnswer = Literal["passed", "moved", "short"]
"""The write fence's answer: passed; refused because the epoch moved on (another claim, an
erasure, an ending); refused because less than the fence margin of this epoch's lease is left."""


class AttemptBackend(Protocol):
    """What an attempt needs from its executor (implemented in ``outbox_core.executor``)."""

    async def begin_write(self, action_id: int, epoch: int) -> FenceAnswer: ...

    def lease_transaction(
        self, action_id: int, epoch: int
    ) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


class WriteFence:
    """``begin_write()`` just before each provider write."""

    def __init__(self, attempt: ActionAttempt) -> None:
        self._attempt = attempt

    async def begin_write(self) -> bool:
        """Mark that this attempt's write may reach the provider, in a short transaction of its
        own. False when another claim took the action, an erasure deleted it, or less than the
        fence margin (60 s) of the lease is left: then do not call the provider and return
        ``Abandoned()``. It may be called more than once in an attempt (once per copy).

        After a refusal for the margin (the epoch still this attempt's) and before any fence of
        this attempt passed, ``Abandoned()`` gives the action back at once: ADMITTED, due now,
        the attempt not counted (as a ``Defer``), so the next claim runs it with a whole lease."""
        attempt = self._attempt
        if attempt._in_transaction:
            raise OutboxError(
                "begin_write() inside attempt.transaction() would wait on its own row lock; "
                "fence first, or after the transaction"
            )
        answer = await attempt._backend.begin_write(attempt.id, attempt.epoch)
        if attempt.span is not None:
            tracing.fence_event(attempt.span, answer)
        if answer == "passed":
            attempt.fenced = True
            return True
        attempt.refused = True
        if answer == "short":
            attempt.short_of_lease = True
        return False


class ActionAttempt:
    """The claimed action, its epoch and attempt number, and the attempt's fence."""

    def __init__(
        self, claimed: ClaimedAction, backend: AttemptBackend, decoded: BaseModel | None
    ) -> None:
        self.action = claimed
        self._backend = backend
        self._decoded = decoded
        self._in_transaction = False
        self.fenced = False
        """True once this attempt's begin_write() succeeded."""
        self.refused = False
        """True once this attempt's begin_write() was refused."""
        self.short_of_lease = False
        """True once a begin_write() was refused for the fence margin while the epoch was still
        this attempt's (not because another holder took the action)."""
        self.span: Span | None = None
        """The attempt's span while tracing is on (:mod:`outbox_core.tracing`), else None."""

    @property
    def id(self) -> int:
        return self.action.id

    @property
    def kind(self) -> str:
        return self.action.kind

    @property
    def epoch(self) -> int:
        return self.action.epoch

    @property
    def number(self) -> int:
        """1 for the first attempt; a Defer does not count (nor a claim given back unstarted,
        nor a Reread from an attempt that only read back), so the number repeats after one.
        See :attr:`run` for the count of runs."""
        return self.action.attempt

    @property
    def run(self) -> int:
        """How many times this action has been claimed, this claim included: 1 for the first.
        Unlike :attr:`number` it counts every claim (after a ``Defer``, a ``Reread``, a lease
        that ran out, a fence given back for its margin), so an attempt can tell that it is a
        re-run (``run > number``) after a Defer. It is the claim's epoch, which the database
        raises by one on each claim and on nothing else; a claim that the executor gave back
        before the adapter saw it (a shutdown, an undecodable payload) counts too."""
        return self.action.epoch

    @property
    def is_last(self) -> bool:
        """This attempt is the last that may write: a Reread after its ``begin_write()`` ends
        the action UNCERTAIN. An attempt that only reads back is not bounded by it but by the
        kind's ``unreadable_for``: do not give up a read on ``is_last``."""
        return self.action.attempt >= self.action.max_attempts

    @property
    def payload(self) -> dict[str, Any]:
        return self.action.payload or {}

    @property
    def body(self) -> BaseModel | None:
        """The payload decoded as the kind's declared model (the tagged body for tagged
        variants)."""
        return self._decoded

    @property
    def idempotency_key(self) -> str:
        return self.action.idempotency_key

    @property
    def lane_key(self) -> str:
        return self.action.lane_key

    @property
    def workspace_id(self) -> str | None:
        return self.action.workspace_id

    @property
    def subject_account_id(self) -> str | None:
        return self.action.subject_account_id

    @property
    def write_started(self) -> bool:
        """An earlier attempt's write may have reached the provider: read back first."""
        return self.action.write_started_at is not None

    def fence(self) -> WriteFence:
        return WriteFence(self)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A transaction for the adapter's own domain writes under this attempt's lease. It
        raises :class:`LeaseLost` (and writes nothing) when the epoch moved on; while it is
        open, no other claim can take the action."""
        self._in_transaction = True
        try:
            async with self._backend.lease_transaction(self.id, self.epoch) as conn:
                yield conn
        finally:
            self._in_transaction = False
