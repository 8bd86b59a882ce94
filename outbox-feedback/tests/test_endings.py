"""A send that ends without settling its copies (uncertain, reaped after its process died,
expired) leaves each copy's row true to what the tracker holds, and the next send reads the
copies that may exist back by their markers before it writes."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import FeedbackSendQueue, decide
from outbox_issues.testing import GitHubTestServer

from .conftest import action, copies, feedback, one_each, store

# An executor in a process of its own, which the test kills in the middle of a copy's write.
CHILD = """
import asyncio, sys
from outbox_core import Executor, KindRegistry, Outbox, OutboxSettings
from outbox_feedback.adapter import ADAPTERS
from outbox_issues.settings import IssuesSettings

url, schema, api, token = sys.argv[1:5]
tracker = IssuesSettings(api_url=api, token=token, listing_lag_seconds=0,
                         connect_timeout_seconds=2, request_timeout_seconds=50)
registry = KindRegistry()
for adapter in ADAPTERS:
    registry.register(adapter.bind(tracker), distribution="outbox-feedback")
settings = OutboxSettings(schema_name=schema)
outbox = Outbox(schema=schema, registry=registry, settings=settings)

async def main():
    async with Executor(outbox, url, settings=settings) as executor:
        await executor.drain(timeout=120)

asyncio.run(main())
"""


def states(db: OutboxTestDatabase) -> dict[str, str]:
    return {copy.item_id: copy.state for copy in feedback(db).copies}


def edit_again(db: OutboxTestDatabase) -> int:
    with db.connect() as conn:
        decide(conn, "fb-1", outbox=db.outbox, summary="Still two nits.")
        return FeedbackSendQueue(db.outbox).queue(conn, "fb-1").action_id


def test_an_uncertain_send_leaves_its_unsettled_copy_unknown_and_the_next_send_finds_it(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    tracker_server.drop("create_review_comment", after_recording=True)
    queued = store(feedback_db, pull, max_attempts=1)
    feedback_db.drain()

    assert action(feedback_db, queued.action_id) == (
        ActionState.UNCERTAIN,
        StopReason.ATTEMPTS_EXHAUSTED,
    )
    # True to the tracker: the summary is there, i1 may be (it is), i2 was never written.
    assert states(feedback_db) == {"summary": "present", "i1": "unknown", "i2": "absent"}
    assert set(copies(tracker_server, pull)) == {"summary", "i1"}

    edit = edit_again(feedback_db)
    feedback_db.drain()
    assert action(feedback_db, edit)[0] is ActionState.DONE
    one_each(tracker_server, pull)
    assert set(states(feedback_db).values()) == {"present"}


def test_a_send_reaped_after_its_process_died_mid_write_leaves_its_copies_rows_true(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    queued = store(feedback_db, pull, max_attempts=1)
    tracker_server.hold("create_review_comment")  # recorded; the answer waits
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            feedback_db.url,
            feedback_db.schema,
            tracker_server.api_url,
            tracker_server.token,
        ],
    )
    try:
        assert tracker_server.held.wait(60), "the child executor never reached the write"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        tracker_server.release()
    assert states(feedback_db) == {"summary": "present", "i1": "writing", "i2": "absent"}

    feedback_db.execute(
        "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 second' WHERE id = %s",
        (queued.action_id,),
    )
    feedback_db.drain()  # the reaper ends it: its last attempt's lease ran out

    state, _ = action(feedback_db, queued.action_id)
    assert state is ActionState.UNCERTAIN
    assert states(feedback_db) == {"summary": "present", "i1": "unknown", "i2": "absent"}
    assert set(copies(tracker_server, pull)) == {"summary", "i1"}
    edit = edit_again(feedback_db)
    feedback_db.drain()
    assert action(feedback_db, edit)[0] is ActionState.DONE
    one_each(tracker_server, pull)


def test_a_send_that_expired_after_a_deferral_leaves_no_copy_on_either_side(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    tracker_server.primary_limit("create_comment", reset_in=3600)
    queued = store(feedback_db, pull, expires_at=datetime.now(UTC) + timedelta(hours=1))
    feedback_db.drain()
    assert action(feedback_db, queued.action_id)[0] is ActionState.ADMITTED
    feedback_db.execute(
        "UPDATE {schema}.agent_action SET expires_at = now() - interval '1 second' WHERE id = %s",
        (queued.action_id,),
    )
    feedback_db.drain()

    assert action(feedback_db, queued.action_id) == (ActionState.CANCELLED, StopReason.EXPIRED)
    assert set(states(feedback_db).values()) == {"absent"}
    assert copies(tracker_server, pull) == {}
    seen = feedback(feedback_db)
    assert (seen.last_send_state, seen.last_stop_reason) == ("CANCELLED", "EXPIRED")
    assert seen.delivered_revision is None
    rows = feedback_db.scalar(
        "SELECT count(*) FROM {schema}.agent_action WHERE lane_key = 'feedback:fb-1'"
    )
    assert rows == 1  # nothing owed: no correction
