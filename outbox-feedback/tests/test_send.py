"""Deliver, edit and retract against the loopback tracker: the copies end as decided, one of
each, found by marker, also when the tracker accepts a copy's write and drops the answer."""

from __future__ import annotations

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import SUPERSEDED, CopyState, FeedbackSendQueue, Item, decide, mark, retract
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import COMMIT, ITEMS, action, copies, feedback, one_each, queue, store


def test_deliver_creates_the_summary_comment_and_one_review_comment_per_item(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    queued = store(feedback_db, pull)
    feedback_db.drain()

    assert queued.idempotency_key == "feedback:fb-1:1:review"
    assert action(feedback_db, queued.action_id) == (ActionState.DONE, StopReason.COMPLETED)
    found = one_each(tracker_server, pull)
    assert "Two nits" in found["summary"].body and not found["summary"].review
    assert (found["i1"].path, found["i1"].line, found["i1"].side) == ("src/app.py", 12, "RIGHT")
    assert (found["i2"].line, found["i2"].side, found["i2"].commit_id) == (40, "LEFT", COMMIT)
    seen = feedback(feedback_db)
    assert seen.delivered_revision == 1 and seen.last_send_state == "DONE"
    assert [(c.item_id, c.state) for c in seen.copies] == [
        ("summary", "present"),
        ("i1", "present"),
        ("i2", "present"),
    ]
    assert {c.provider_id for c in seen.copies} == {c.id for c in found.values()}


FAULTS = {
    # (the send, where the fault is): the operation that accepts the write and drops the answer
    ("deliver", "summary"): "create_comment",
    ("deliver", "inline"): "create_review_comment",
    ("edit", "summary"): "update_comment",
    ("edit", "inline"): "update_review_comment",
    ("retract", "summary"): "delete_comment",
    ("retract", "inline"): "delete_review_comment",
}


@pytest.mark.parametrize(("send", "where"), sorted(FAULTS))
def test_an_accepted_write_whose_answer_is_lost_leaves_exactly_one_copy_of_each_item(
    feedback_db: OutboxTestDatabase,
    tracker_server: GitHubTestServer,
    pull: int,
    send: str,
    where: str,
) -> None:
    if send != "deliver":
        store(feedback_db, pull)
        feedback_db.drain()
        with feedback_db.connect() as conn:
            if send == "edit":
                decide(
                    conn,
                    "fb-1",
                    outbox=feedback_db.outbox,
                    summary="One nit left.",
                    items=(ITEMS[0], Item("i2", "src/app.py", COMMIT, 40, "LEFT", "Keep it.")),
                )
            else:
                retract(conn, "fb-1", outbox=feedback_db.outbox)
            queued = FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
        tracker_server.drop(FAULTS[(send, where)], after_recording=True)
    else:
        tracker_server.drop(FAULTS[(send, where)], after_recording=True)
        queued = store(feedback_db, pull)

    feedback_db.drain()  # the write is accepted, its answer lost: Reread
    state, _ = action(feedback_db, queued.action_id)
    assert state is ActionState.EXECUTING
    lost = "summary" if where == "summary" else "i2" if send == "edit" else "i1"
    states = {c.item_id: c.state for c in feedback(feedback_db).copies}
    assert states[lost] == "writing"

    feedback_db.drain()  # read back by marker, then the rest

    assert action(feedback_db, queued.action_id) == (ActionState.DONE, StopReason.COMPLETED)
    if send == "retract":
        assert copies(tracker_server, pull) == {}
        assert {c.state for c in feedback(feedback_db).copies} == {"absent"}
        return
    found = one_each(tracker_server, pull)
    if send == "edit":
        assert "One nit left." in found["summary"].body
        assert "Keep it." in found["i2"].body
    assert {c.state for c in feedback(feedback_db).copies} == {"present"}
    # Each copy was written once by this send, never twice.
    assert tracker_server.writes_for(queued.idempotency_key) == (3 if send == "deliver" else 2)


def test_an_edit_deletes_and_recreates_an_item_that_moved_and_deletes_a_dropped_item(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    before = one_each(tracker_server, pull)
    moved = Item("i1", "src/app.py", COMMIT, 14, "RIGHT", "Name this `retries`.")
    with feedback_db.connect() as conn:
        decide(conn, "fb-1", outbox=feedback_db.outbox, items=(moved,))
        queued = FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()

    assert queued.kind == "EDIT_FEEDBACK"
    assert action(feedback_db, queued.action_id)[0] is ActionState.DONE
    after = one_each(tracker_server, pull, ("summary", "i1"))
    assert after["i1"].line == 14 and after["i1"].id != before["i1"].id
    assert after["summary"].id == before["summary"].id  # unchanged: not written
    assert tracker_server.writes_of("update_comment") == 0
    assert tracker_server.writes_of("delete_review_comment") == 2


def test_a_mark_edits_the_body_of_the_review_comment_in_place(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    before = one_each(tracker_server, pull)
    with feedback_db.connect() as conn:
        mark(conn, "fb-1", "i2", outbox=feedback_db.outbox)
        FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()

    after = one_each(tracker_server, pull)
    assert after["i2"].id == before["i2"].id
    assert after["i2"].body.startswith("**Resolved.**")
    assert tracker_server.writes_of("update_review_comment") == 1


def test_an_edit_that_finds_its_copy_gone_creates_it_again(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    gone = one_each(tracker_server, pull)["summary"]
    with tracker_server.lock:
        del tracker_server.comments[gone.id]  # a person deleted it
    with feedback_db.connect() as conn:
        decide(conn, "fb-1", outbox=feedback_db.outbox, summary="Reworded.")
        queued = FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()

    assert action(feedback_db, queued.action_id)[0] is ActionState.DONE
    found = one_each(tracker_server, pull)
    assert "Reworded." in found["summary"].body and found["summary"].id != gone.id


def test_a_retract_whose_copy_is_already_gone_is_done(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    gone = one_each(tracker_server, pull)["i1"]
    with tracker_server.lock:
        del tracker_server.comments[gone.id]
    with feedback_db.connect() as conn:
        retract(conn, "fb-1", outbox=feedback_db.outbox)
        queued = FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
    feedback_db.drain()

    assert queued.kind == "RETRACT_FEEDBACK"
    assert action(feedback_db, queued.action_id) == (ActionState.DONE, StopReason.COMPLETED)
    assert copies(tracker_server, pull) == {}
    assert [c.state for c in feedback(feedback_db).copies] == [CopyState.ABSENT] * 3


def test_a_rate_limit_before_any_copy_defers_and_after_a_copy_rereads(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    tracker_server.primary_limit("create_comment", reset_in=3600)
    queued = store(feedback_db, pull)
    feedback_db.drain()
    row = feedback_db.rows(
        "SELECT state, attempt, write_started_at IS NULL FROM {schema}.agent_action WHERE id = %s",
        (queued.action_id,),
    )[0]
    assert row == ("ADMITTED", 0, True)  # Defer: not counted, nothing written
    assert copies(tracker_server, pull) == {}

    tracker_server.secondary_limit("create_review_comment", retry_after=600)
    feedback_db.drain()  # the summary is written, then the limit: the fence is kept
    row = feedback_db.rows(
        "SELECT state, write_started_at IS NOT NULL FROM {schema}.agent_action WHERE id = %s",
        (queued.action_id,),
    )[0]
    assert row == ("EXECUTING", True)
    assert set(copies(tracker_server, pull)) == {"summary"}
    feedback_db.drain()
    assert action(feedback_db, queued.action_id)[0] is ActionState.DONE
    one_each(tracker_server, pull)


def test_a_line_outside_the_diff_fails_the_send_and_its_copy_stays_absent(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    tracker_server.validation_failed("create_review_comment", "line")
    queued = store(feedback_db, pull)
    feedback_db.drain()

    assert action(feedback_db, queued.action_id) == (ActionState.FAILED, "GITHUB_422")
    states = {c.item_id: c.state for c in feedback(feedback_db).copies}
    assert states == {"summary": "present", "i1": "absent", "i2": "absent"}
    assert feedback(feedback_db).last_stop_reason == "GITHUB_422"


def test_a_422_on_a_copys_body_fails_the_send_as_content_refused(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    tracker_server.validation_failed("create_comment", "data")  # a limit this package missed
    queued = store(feedback_db, pull)
    feedback_db.drain()

    assert action(feedback_db, queued.action_id) == (ActionState.FAILED, "CONTENT_REFUSED")
    assert feedback(feedback_db).last_stop_reason == "CONTENT_REFUSED"
    assert {c.item_id: c.state for c in feedback(feedback_db).copies}["summary"] == "absent"


def test_a_new_send_replaces_an_unstarted_one(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    first = store(feedback_db, pull)
    second = queue(feedback_db)

    assert second.replaced == (first.action_id,)
    assert action(feedback_db, first.action_id) == (ActionState.CANCELLED, SUPERSEDED)
    assert second.idempotency_key == "feedback:fb-1:2:review"
    feedback_db.drain()
    assert action(feedback_db, second.action_id)[0] is ActionState.DONE
    one_each(tracker_server, pull)
    assert PUBLIC in tracker_server.repositories
