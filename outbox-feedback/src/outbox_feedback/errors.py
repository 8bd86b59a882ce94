"""The errors outbox-feedback raises on purpose. Each message says what was wrong and what to do."""

from __future__ import annotations

from outbox_core import InvalidRequest, OutboxError


class UnknownFeedback(InvalidRequest):
    """No feedback of this id was stored (or its author was erased)."""


class FeedbackRetracted(InvalidRequest):
    """The feedback was retracted: it takes no more decisions or marks."""


class SendInProgress(OutboxError):
    """A send of this feedback is running: ``queue`` refuses a new one. Commit the decision
    anyway; the running send's ``ended`` hook queues the correction. ``status`` is 409 for an
    application's HTTP layer (Conflict)."""

    status = 409

    def __init__(self, feedback_id: str, action_id: int) -> None:
        super().__init__(
            f"feedback {feedback_id!r}: send {action_id} is running; the decision, once "
            "committed, is carried by a correction that the running send queues when it ends"
        )
        self.feedback_id = feedback_id
        self.action_id = action_id


class NewerSendInLane(OutboxError):
    """The feedback's lane holds a send that this build cannot read (a newer build wrote it,
    during a rolling update): ``queue`` refuses rather than enqueue behind it. A replica of the
    newer build carries it out; try again there, or after the rollout."""
