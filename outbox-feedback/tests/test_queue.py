"""The send queue: one lane per feedback, its newest action the feedback's send. A new send
replaces an unstarted one; while a send runs, ``queue`` refuses with 409 and the running send's
ended hook queues exactly one correction. Both under concurrent callers (threads)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from outbox_core import ActionState
from outbox_core.testing import OutboxTestDatabase
from outbox_feedback import (
    EDIT_FEEDBACK,
    SUPERSEDED,
    FeedbackSendQueue,
    SendInProgress,
    UnknownFeedback,
    adecide,
    decide,
)
from outbox_issues.testing import PUBLIC, GitHubTestServer

from .conftest import action, feedback, one_each, store

CALLERS = 6


def sends(db: OutboxTestDatabase) -> list[tuple[str, str, str, str | None]]:
    return [
        (row[0], row[1], row[2], row[3])
        for row in db.rows(
            "SELECT kind, idempotency_key, state, stop_reason FROM {schema}.agent_action "
            "WHERE lane_key = 'feedback:fb-1' ORDER BY id"
        )
    ]


def in_threads(count: int, call: Callable[[int], Any]) -> list[Any]:
    """``call(i)`` in ``count`` threads that start together; each one's answer or exception."""
    barrier = threading.Barrier(count)
    answers: list[Any] = [None] * count

    def run(index: int) -> None:
        barrier.wait()
        try:
            answers[index] = call(index)
        except Exception as exc:  # the test looks at each one
            answers[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


def decide_and_queue(db: OutboxTestDatabase, index: int) -> Any:
    """One application request: a new summary and its send, in one transaction."""

    async def go() -> Any:
        async with await db.aconnect() as conn:
            await adecide(conn, "fb-1", outbox=db.outbox, summary=f"Decision {index}.")
            try:
                return await FeedbackSendQueue(db.outbox).aqueue(conn, "fb-1")
            except SendInProgress as refused:
                await conn.commit()  # the decision commits; the running send corrects it
                return refused
            finally:
                await conn.commit()

    return asyncio.run(go())


def test_concurrent_callers_each_replace_the_unstarted_send_and_one_send_is_left(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)

    answers = in_threads(CALLERS, lambda i: decide_and_queue(feedback_db, i))

    assert not [a for a in answers if isinstance(a, BaseException)], answers
    rows = sends(feedback_db)
    assert len(rows) == CALLERS + 1
    assert [state for _, _, state, _ in rows[:-1]] == ["CANCELLED"] * CALLERS
    assert {reason for _, _, _, reason in rows[:-1]} == {SUPERSEDED}
    assert rows[-1][2] == "ADMITTED"
    assert sorted(key for _, key, _, _ in rows) == sorted(
        f"feedback:fb-1:{n}:review" for n in range(1, CALLERS + 2)
    )
    feedback_db.drain()
    found = one_each(tracker_server, pull)
    assert f"Decision {int(feedback(feedback_db).summary.split()[1].rstrip('.'))}." in (
        found["summary"].body
    )


def run_in_background(db: OutboxTestDatabase) -> threading.Thread:
    thread = threading.Thread(target=lambda: asyncio.run(db.adrain()), daemon=True)
    thread.start()
    return thread


def test_queue_during_a_running_send_is_refused_with_409_and_the_send_queues_one_correction(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    first = store(feedback_db, pull)
    tracker_server.hold("create_comment")  # the send holds its summary's write
    executor = run_in_background(feedback_db)
    assert tracker_server.held.wait(30)

    answers = in_threads(CALLERS, lambda i: decide_and_queue(feedback_db, i))

    assert all(isinstance(a, SendInProgress) for a in answers), answers
    assert {a.status for a in answers} == {409}
    assert {a.action_id for a in answers} == {first.action_id}
    tracker_server.release()
    executor.join(60)
    rows = sends(feedback_db)
    assert [(kind, state) for kind, _, state, _ in rows] == [
        ("DELIVER_FEEDBACK", "DONE"),
        (EDIT_FEEDBACK, "DONE"),  # exactly one correction, carried out in the same drain
    ]
    assert rows[1][1] == "feedback:fb-1:2:review"
    final = feedback(feedback_db)
    assert final.delivered_revision == final.revision == CALLERS + 1
    assert final.summary in one_each(tracker_server, pull)["summary"].body


def test_a_send_that_read_the_latest_decision_queues_no_correction(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    feedback_db.drain()
    assert [state for _, _, state, _ in sends(feedback_db)] == ["DONE"]
    assert feedback(feedback_db).delivered_revision == 1


def test_queue_refuses_an_unknown_feedback_and_writes_nothing(
    feedback_db: OutboxTestDatabase,
) -> None:
    with feedback_db.connect() as conn, pytest.raises(UnknownFeedback, match="no feedback"):
        FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-none")
    assert feedback_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


def test_the_sync_queue_cannot_replace_a_send_and_says_to_use_aqueue(
    feedback_db: OutboxTestDatabase, pull: int
) -> None:
    from outbox_core.steps import NeedsAsync

    first = store(feedback_db, pull)
    with feedback_db.connect() as conn:
        decide(conn, "fb-1", outbox=feedback_db.outbox, summary="Again.")
        with pytest.raises(NeedsAsync, match="aqueue"):
            FeedbackSendQueue(feedback_db.outbox).queue(conn, "fb-1")
        conn.rollback()
    assert action(feedback_db, first.action_id)[0] is ActionState.ADMITTED
    assert len(sends(feedback_db)) == 1


def test_an_application_holding_the_feedback_row_delays_only_that_ending_and_loses_nothing(
    feedback_db: OutboxTestDatabase,
    tracker_server: GitHubTestServer,
    pull: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="outbox")
    first = store(feedback_db, pull)
    other_pull = tracker_server.add_pull_request(PUBLIC, "Another change")
    other = store(feedback_db, other_pull, "fb-2", items=())
    tracker_server.hold("create_review_comment")  # only fb-1 has inline items
    executor = run_in_background(feedback_db)
    assert tracker_server.held.wait(30)

    async def hold_the_row_while_the_send_ends() -> None:
        async with await feedback_db.aconnect() as conn:
            await adecide(conn, "fb-1", outbox=feedback_db.outbox, summary="Held decision.")
            with pytest.raises(SendInProgress):
                await FeedbackSendQueue(feedback_db.outbox).aqueue(conn, "fb-1")
            tracker_server.release()
            # The send ends now; its hook meets this transaction's row lock and fails under
            # its short lock_timeout, and the core writes the ending again after a pause.
            for _ in range(600):
                if any(
                    r.getMessage().startswith("action.ended.hook_failed") for r in caplog.records
                ):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the send's ended hook never met the held row")
            assert action(feedback_db, other.action_id)[0] is ActionState.DONE  # not stalled
            await conn.commit()

    asyncio.run(hold_the_row_while_the_send_ends())
    executor.join(60)

    rows = sends(feedback_db)
    assert [(kind, state) for kind, _, state, _ in rows] == [
        ("DELIVER_FEEDBACK", "DONE"),
        (EDIT_FEEDBACK, "DONE"),
    ]
    assert action(feedback_db, first.action_id)[0] is ActionState.DONE
    assert "Held decision." in one_each(tracker_server, pull)["summary"].body
