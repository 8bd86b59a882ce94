"""outbox-feedback: feedback on a pull request carried to a GitHub-compatible tracker as a
summary comment and inline review comments, delivered, edited and retracted one send at a time.

Store a feedback with :func:`create_feedback`, change it with :func:`decide`, :func:`mark` and
:func:`retract`, and queue its send with :class:`FeedbackSendQueue` in the same transaction.
The loopback tracker for tests is :mod:`outbox_feedback.testing` (over outbox-issues').
"""

from .adapter import (
    DELIVER_FEEDBACK,
    EDIT_FEEDBACK,
    FEEDBACK_ERASED,
    RETRACT_FEEDBACK,
    SUPERSEDED,
    DeliverFeedbackAdapter,
    EditFeedbackAdapter,
    FeedbackAdapter,
    RetractFeedbackAdapter,
)
from .copies import CopyState, Item
from .domain import Copy, Feedback, lane, send_key
from .enqueue import (
    acreate_feedback,
    adecide,
    aget_feedback,
    amark,
    aretract,
    create_feedback,
    decide,
    get_feedback,
    mark,
    retract,
)
from .errors import FeedbackRetracted, NewerSendInLane, SendInProgress, UnknownFeedback
from .send_queue import FeedbackSendQueue, Queued

__all__ = [
    "DELIVER_FEEDBACK",
    "EDIT_FEEDBACK",
    "FEEDBACK_ERASED",
    "RETRACT_FEEDBACK",
    "SUPERSEDED",
    "Copy",
    "CopyState",
    "DeliverFeedbackAdapter",
    "EditFeedbackAdapter",
    "Feedback",
    "FeedbackAdapter",
    "FeedbackRetracted",
    "FeedbackSendQueue",
    "Item",
    "NewerSendInLane",
    "Queued",
    "RetractFeedbackAdapter",
    "SendInProgress",
    "UnknownFeedback",
    "acreate_feedback",
    "adecide",
    "aget_feedback",
    "amark",
    "aretract",
    "create_feedback",
    "decide",
    "get_feedback",
    "lane",
    "mark",
    "retract",
    "send_key",
]
