"""Queueing a feedback's send: :class:`FeedbackSendQueue`'s ``queue(conn, feedback_id)``
enqueues it in the transaction that changed the feedback, under the feedback's row lock, and
replaces an unstarted send of the feedback (it ends CANCELLED, ``SUPERSEDED``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection

from outbox_core import ActionState, Outbox, UndecodableAction, default_outbox
from outbox_core.lane_locks import LocksBusy
from outbox_core.steps import NeedsAsync, Query, Steps, arun, run

from .adapter import DELIVER_FEEDBACK, EDIT_FEEDBACK, RETRACT_FEEDBACK, SUPERSEDED
from .domain import lane, queries, send_request
from .enqueue import checked_feedback_id, locked_row
from .errors import NewerSendInLane, SendInProgress

CANCEL_WAIT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Queued:
    """What ``queue`` enqueued: the send (its action, kind and key) and the unstarted sends it
    replaced (they ended CANCELLED with ``SUPERSEDED``)."""

    feedback_id: str
    action_id: int
    kind: str
    idempotency_key: str
    replaced: tuple[int, ...] = ()


class FeedbackSendQueue:
    """Queues a feedback's send: one lane per feedback, the newest action of the lane is its
    send. ``queue`` runs in the transaction that changes the feedback."""

    def __init__(self, outbox: Outbox | None = None) -> None:
        self._outbox = outbox

    @property
    def outbox(self) -> Outbox:
        return self._outbox if self._outbox is not None else default_outbox()

    def queue_steps(
        self,
        feedback_id: str,
        *,
        expires_at: datetime | None = None,
        max_attempts: int | None = None,
    ) -> Steps[Queued]:
        """:meth:`queue` as steps."""
        outbox = self.outbox
        feedback_id = checked_feedback_id(feedback_id)
        named = queries(outbox.schema)
        row = locked_row(
            (yield Query(named["lock_feedback"], {"feedback": feedback_id})), feedback_id
        )
        workspace, author, _, retracted_at, sends, delivered = row
        try:
            # The decoding read: a send this build cannot read (a newer build's variant) fails
            # here, and nothing is enqueued behind it.
            live = yield from outbox.lane_steps(lane(feedback_id), live_only=True, decode=True)
        except UndecodableAction as exc:
            raise NewerSendInLane(
                f"feedback {feedback_id!r}: its lane holds a send that this build cannot read "
                f"({exc}); a replica of the newer build carries it out, queue from there"
            ) from None
        for action in live:
            if action.state is ActionState.EXECUTING or action.write_started_at is not None:
                raise SendInProgress(feedback_id, action.id)
        kind = (
            RETRACT_FEEDBACK
            if retracted_at is not None
            else DELIVER_FEEDBACK
            if delivered is None
            else EDIT_FEEDBACK
        )
        request = send_request(
            kind,
            feedback_id,
            int(sends) + 1,
            workspace=workspace,
            author=author,
            expires_at=expires_at,
            max_attempts=max_attempts,
        )
        outbox.prepare(request)  # refused here, before anything is written
        replaced: list[int] = []
        for action in live:
            try:
                cancelled = yield from outbox.cancel_steps(
                    action.id, SUPERSEDED, lock_wait_seconds=CANCEL_WAIT_SECONDS
                )
            except NeedsAsync:
                raise NeedsAsync(
                    f"feedback {feedback_id!r}: replacing its unstarted send {action.id} runs "
                    "that send's async ended hook; queue from async code with "
                    "`await FeedbackSendQueue().aqueue(conn, ...)`"
                ) from None
            except LocksBusy:
                cancelled = None
            if cancelled is None:  # claimed meanwhile: it runs now
                raise SendInProgress(feedback_id, action.id)
            replaced.append(action.id)
        yield Query(named["next_send"], {"feedback": feedback_id})
        enqueued = yield from outbox.enqueue_steps(request)
        return Queued(feedback_id, enqueued.id, kind, request.idempotency_key, tuple(replaced))

    def queue(self, conn: Connection[Any], feedback_id: str, **options: Any) -> Queued:
        """Enqueue the feedback's send (``DELIVER_FEEDBACK`` before anything was delivered,
        ``EDIT_FEEDBACK`` after, ``RETRACT_FEEDBACK`` once retracted) in ``conn``'s
        transaction, under the feedback's row lock. An unstarted send of the feedback is
        cancelled (``SUPERSEDED``) and replaced. Raises :class:`SendInProgress` (status 409)
        while a send runs: commit the change anyway, the running send's ended hook queues the
        correction. Raises :class:`NewerSendInLane` when the lane holds a send this build cannot
        read. Replacing an unstarted send runs its async ended hook: from sync code that raises
        :class:`~outbox_core.steps.NeedsAsync` (nothing written); use :meth:`aqueue`."""
        return run(conn, self.queue_steps(feedback_id, **options))

    async def aqueue(self, conn: AsyncConnection[Any], feedback_id: str, **options: Any) -> Queued:
        """The async twin of :meth:`queue`."""
        return await arun(conn, self.queue_steps(feedback_id, **options))
