"""A copy is read back only from what the token's own identity wrote. A copy marker is
predictable (the feedback's id and the item), so the pull request's author, or anyone who can
comment on it, can plant one ahead of time: after a lost answer the send must settle its own
copy, edit and delete only that one, and a retract must leave no copy of ours visible."""

from __future__ import annotations

import logging

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import FeedbackSendQueue, decide, retract
from outbox_feedback.copies import copy_marker
from outbox_issues.testing import OTHER_LOGIN, PUBLIC, GitHubTestServer

from .conftest import ITEMS, action, copies, feedback, store

ITEM_IDS = ("summary", *(item.item_id for item in ITEMS))
SURFACES = {
    # the copy, how its marker is planted, the operation whose answer is lost
    "summary": ("summary", "add_comment", "create_comment"),
    "inline": ("i1", "add_review_comment", "create_review_comment"),
}


def plant(server: GitHubTestServer, pull: int, how: str, item: str) -> int:
    planted: int = getattr(server, how)(
        PUBLIC, pull, f"Planted.\n\n{copy_marker('fb-1', item)}\n", user=OTHER_LOGIN
    )
    return planted


def ours(server: GitHubTestServer, pull: int, item: str) -> list[int]:
    return [c.id for c in copies(server, pull).get(item, []) if c.user == server.login]


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_a_planted_copy_marker_is_never_taken_for_the_copy_and_a_retract_leaves_none_of_ours(
    feedback_db: OutboxTestDatabase,
    tracker_server: GitHubTestServer,
    pull: int,
    surface: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="outbox")
    item, how, lost = SURFACES[surface]
    planted = plant(tracker_server, pull, how, item)  # ahead of time: first in the listing
    body = tracker_server.comments[planted].body
    tracker_server.drop(lost, after_recording=True)
    queued = store(feedback_db, pull)

    feedback_db.drain()  # the copy is written, its answer lost
    feedback_db.drain()  # read back by marker

    assert action(feedback_db, queued.action_id) == (ActionState.DONE, StopReason.COMPLETED)
    [mine] = ours(tracker_server, pull, item)
    [row] = [c for c in feedback(feedback_db).copies if c.item_id == item]
    assert (row.state, row.provider_id) == ("present", mine)
    events = [r for r in caplog.records if getattr(r, "event", None) == "readback.foreign_marker"]
    assert [(getattr(r, "action.author"), getattr(r, "action.ref")) for r in events] == [
        (OTHER_LOGIN, str(planted))
    ]

    with feedback_db.connect() as conn:  # an edit of every copy, then a retract
        decide(conn, "fb-1", outbox=feedback_db.outbox, summary="One nit.")
        FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()
    with feedback_db.connect() as conn:
        retract(conn, "fb-1", outbox=feedback_db.outbox)
        retracted = FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()

    assert action(feedback_db, retracted.action_id) == (ActionState.DONE, StopReason.COMPLETED)
    assert [name for name in ITEM_IDS if ours(tracker_server, pull, name)] == []
    assert tracker_server.comments[planted].body == body  # never edited, never deleted
