"""The scheduled executor (run loop), as `outbox run` drives it: more actions than places."""

from __future__ import annotations

import asyncio
import time

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase


async def run_until_done(db: OutboxTestDatabase, total: int, **settings: object) -> float:
    stop = asyncio.Event()
    executor = db.executor(**settings)
    runner = asyncio.create_task(executor.run(stop))
    started = time.monotonic()
    try:
        while db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'") < total:
            assert not runner.done(), runner
            assert time.monotonic() - started < 60, "the executor stalled"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await runner
        await executor.close()
    return time.monotonic() - started


async def test_the_run_loop_carries_out_more_actions_than_it_has_places(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn, [ActionRequest("TEST_FENCED", f"lane-{i % 300}", f"k-{i}") for i in range(600)]
        )
        conn.commit()
    await run_until_done(db, 600, concurrency=7, claim_batch=3)
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE epoch <> 1") == 0


async def test_an_action_enqueued_while_the_executor_idles_starts_without_waiting_for_a_poll(
    db: OutboxTestDatabase,
) -> None:
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=30.0)
    runner = asyncio.create_task(executor.run(stop))
    try:
        await asyncio.sleep(0.5)  # idle: its first claim found nothing
        with db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "wake-me"))
            conn.commit()
        deadline = time.monotonic() + 5  # far below the 30 s poll: the NOTIFY woke it
        while db.scalar("SELECT state FROM {schema}.agent_action") != "DONE":
            assert time.monotonic() < deadline, "the notification did not wake the executor"
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await runner
        await executor.close()
