"""The feedback and its copies: the domain rows the three send kinds move.

A **feedback** is a review of one pull request: a summary and inline items (each on one line
of the diff: commit, file, line, side), with marks such as *resolved*, in revisions (every
decision or mark that commits raises the revision). Its **copies** are what the tracker holds
of it: the summary comment and one review comment per inline item, each with a row of its own
(``feedback_copy``) that says what is known of it (:class:`~outbox_feedback.copies.CopyState`).

Every send of a feedback runs in the feedback's lane, ``feedback:<id>``, with the key
``feedback:<id>:<n>:<variant>``; the newest action of the lane is the feedback's send.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox_core import ActionRequest, package_queries

FEEDBACK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
VARIANT = "review"
"""The variant this build sends: the summary comment and the inline review comments. A newer
build that carries something else (say, resolving review threads) names it in the key's last
segment, and older replicas skip its sends (``ActionVariants.key_suffix``)."""
VARIANTS = (VARIANT,)


def lane(feedback_id: str) -> str:
    """The feedback's lane: its sends run one at a time, in id order."""
    return f"feedback:{feedback_id}"


def send_key(feedback_id: str, number: int, variant: str = VARIANT) -> str:
    """The key of the feedback's ``number``-th send."""
    return f"feedback:{feedback_id}:{number}:{variant}"


def send_request(
    kind: str,
    feedback_id: str,
    number: int,
    *,
    workspace: str | None,
    author: str | None,
    expires_at: datetime | None = None,
    max_attempts: int | None = None,
) -> ActionRequest:
    """The feedback's ``number``-th send as a request: its lane, its key, and a payload of
    identifiers only (the adapter reads the rest). Queued by the application
    (:mod:`outbox_feedback.send_queue`) and, for a correction, by a send's ``ended`` hook."""
    return ActionRequest(
        kind=kind,
        lane_key=lane(feedback_id),
        idempotency_key=send_key(feedback_id, number),
        payload={"feedback": feedback_id},
        workspace_id=workspace,
        subject_account_id=author,
        expires_at=expires_at,
        max_attempts=max_attempts,
    )


def feedback_of(lane_key: str) -> str:
    """The feedback of a send's lane (``ended`` reads it there: an ended action keeps no
    payload)."""
    return lane_key.split(":", 1)[1]


def queries(schema: str) -> dict[str, str]:
    """This package's named statements with the schema filled in."""
    return package_queries("outbox_feedback", "sql/queries.sql", schema)


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy as the application sees it."""

    item_id: str
    surface: str
    state: str
    provider_id: int | None
    url: str | None
    digest: str | None
    write_op: str | None


@dataclass(frozen=True, slots=True)
class Feedback:
    """A feedback as the application sees it: its revision, what was delivered, its last send,
    and its copies."""

    feedback_id: str
    workspace_id: str
    repository: str
    pull_number: int
    summary: str
    revision: int
    retracted: bool
    sends: int
    delivered_revision: int | None
    last_send_key: str | None
    last_send_state: str | None
    last_stop_reason: str | None
    copies: tuple[Copy, ...]

    @classmethod
    def from_rows(cls, row: tuple[Any, ...], copies: list[tuple[Any, ...]]) -> Feedback:
        values = [*row, tuple(Copy(*copy) for copy in copies)]
        return cls(*values)
