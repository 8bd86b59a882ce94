import asyncio

from outbox_core import Abandoned, ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter


def test_an_enqueued_noop_action_ends_done_after_drain(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "key-1"))
    assert db.drain() == 1
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"


def test_drain_counts_an_attempt_that_ended_before_the_last_claim_group_was_claimed(
    db: OutboxTestDatabase,
) -> None:
    """With a kind that has a slot limit, drain() claims in two groups; the no-op attempt of
    the first ends while the second is claimed. It ran, and drain() says so (it said 0)."""
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "key-1"))
    assert db.drain(kind_concurrency={"TEST_FENCED": 1}) == 1
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"


async def test_drain_leaves_alone_an_attempt_that_another_executor_is_running(
    db: OutboxTestDatabase,
) -> None:
    """drain() ends the waits that a Reread set, not every executing lease: it reclaimed an
    attempt that another executor was running, mid-write."""
    running, release = asyncio.Event(), asyncio.Event()

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        if attempt.epoch == 1:
            running.set()
            await release.wait()  # the first holder's provider call is in flight
        return Done(f"epoch-{attempt.epoch}")

    ScriptedAdapter.script = run
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "k"))
        conn.commit()
    async with db.executor() as holder:
        rows, _ = await holder.claims.claim(10)
        attempts = holder.attempts.dispatch(rows)
        await asyncio.wait_for(running.wait(), 10)
        await db.adrain()  # a test's drain beside it
        release.set()
        await asyncio.gather(*attempts)
        await holder.settle()
    assert [call["epoch"] for call in ScriptedAdapter.calls] == [1]
    assert db.rows("SELECT state, readback_ref FROM {schema}.agent_action") == [("DONE", "epoch-1")]
