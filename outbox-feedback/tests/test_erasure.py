"""Erasure of the reviewed work's author: the feedback's rows and its pending sends go, in the
erasure's transaction; a copy's write that already passed its fence still lands."""

from __future__ import annotations

import asyncio

from outbox_core import erase_subject
from outbox_core.testing import OutboxTestDatabase
from outbox_issues.testing import GitHubTestServer

from .conftest import AUTHOR, copies, store
from .test_queue import run_in_background


def erase(db: OutboxTestDatabase) -> dict[str, int]:
    async def go() -> dict[str, int]:
        async with await db.aconnect() as conn:
            report = await erase_subject(conn, AUTHOR, outbox=db.outbox)
            await conn.commit()
            return {"actions": report.actions, **report.catalogs}

    return asyncio.run(go())


def rows(db: OutboxTestDatabase) -> tuple[int, ...]:
    return tuple(
        db.scalar(f"SELECT count(*) FROM {{schema}}.{table}")
        for table in ("feedback", "feedback_item", "feedback_copy", "agent_action")
    )


def test_erasure_of_the_author_deletes_the_feedback_and_its_pending_send(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    store(feedback_db, pull, "fb-other")
    assert rows(feedback_db) == (2, 4, 0, 2)

    erased = erase(feedback_db)

    assert erased["actions"] == 2 and erased["feedback"] == 2
    assert rows(feedback_db) == (0, 0, 0, 0)
    feedback_db.drain()
    assert tracker_server.writes == []


def test_a_copy_write_past_its_fence_still_lands_after_the_erasure(
    feedback_db: OutboxTestDatabase, tracker_server: GitHubTestServer, pull: int
) -> None:
    store(feedback_db, pull)
    tracker_server.hold("create_comment")
    executor = run_in_background(feedback_db)
    assert tracker_server.held.wait(30)

    erase(feedback_db)
    tracker_server.release()
    executor.join(60)

    assert set(copies(tracker_server, pull)) == {"summary"}  # landed, as a moment earlier
    assert rows(feedback_db) == (0, 0, 0, 0)  # and nothing of it is kept
