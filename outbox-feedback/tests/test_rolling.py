"""During a rolling update: a newer build sends a variant that this build lacks (its key's last
segment names it). This build never claims that send, which holds the feedback's lane, and its
``queue`` refuses clearly instead of enqueueing behind a send it cannot read."""

from __future__ import annotations

from typing import ClassVar

import pytest

from outbox_core import ActionRequest, ActionVariants
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import EDIT_FEEDBACK, FeedbackSendQueue, NewerSendInLane, decide
from outbox_feedback.adapter import SendPayload
from outbox_issues.testing import GitHubTestServer

from .conftest import AUTHOR, action, feedback, store

NEWER_KEY = "feedback:fb-1:2:threads"


def as_build(db: OutboxTestDatabase, *, newer: bool) -> None:
    """Register EDIT_FEEDBACK as the newer build has it (it also sends ``threads``), or as
    this build has it."""
    current = db.registry.get(EDIT_FEEDBACK).adapter
    base = current.__mro__[1] if getattr(current, "newer", False) else current
    db.registry.unregister(EDIT_FEEDBACK)
    if not newer:
        db.registry.register(base, distribution="outbox-feedback")
        return

    class NewerEdit(base):  # type: ignore[valid-type, misc]
        newer: ClassVar[bool] = True

        @classmethod
        def variants(cls) -> ActionVariants:
            return ActionVariants.key_suffix(["review", "threads"], SendPayload)

    db.registry.register(NewerEdit, distribution="outbox-feedback", version="0.2.0")


def test_an_older_build_never_claims_a_newer_variant_and_its_queue_refuses_behind_it(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    requests = len(tracker_server.requests)

    as_build(feedback_db, newer=True)
    with feedback_db.connect() as conn:
        newer = feedback_db.outbox.enqueue(
            conn,
            ActionRequest(
                kind=EDIT_FEEDBACK,
                lane_key="feedback:fb-1",
                idempotency_key=NEWER_KEY,
                payload={"feedback": "fb-1"},
                workspace_id="ws-1",
                subject_account_id=AUTHOR,
            ),
        )
        conn.execute(
            f'UPDATE "{feedback_db.schema}".feedback SET sends = 2 WHERE feedback_id = %s',
            ("fb-1",),
        )
        conn.commit()

    as_build(feedback_db, newer=False)
    feedback_db.drain()
    row = feedback_db.rows(
        "SELECT state, epoch FROM {schema}.agent_action WHERE id = %s", (newer.id,)
    )[0]
    assert row == ("ADMITTED", 0)  # never claimed, never failed
    assert len(tracker_server.requests) == requests
    with feedback_db.connect() as conn:
        decide(conn, "fb-1", outbox=feedback_db.outbox, summary="Changed on the old build.")
        with pytest.raises(NewerSendInLane, match="cannot read.*'threads'"):
            FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
        conn.rollback()
    lane = feedback_db.scalar(
        "SELECT count(*) FROM {schema}.agent_action WHERE lane_key = 'feedback:fb-1'"
    )
    assert lane == 2

    as_build(feedback_db, newer=True)
    feedback_db.drain()  # a replica of the newer build carries it out
    assert action(feedback_db, newer.id)[0].value == "DONE"
    assert feedback(feedback_db).last_send_key == NEWER_KEY
