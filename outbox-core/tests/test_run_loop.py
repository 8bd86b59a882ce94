"""The scheduled executor (run loop), as `outbox run` drives it: more actions than places."""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    Done,
)
from outbox_core.executor import Executor
from outbox_core.testing import OutboxTestDatabase

from .kinds import Step
from .test_concurrency import listening


async def run_until_done(
    db: OutboxTestDatabase, total: int, *, limit: float = 60.0, **settings: object
) -> float:
    stop = asyncio.Event()
    executor = db.executor(**settings)
    runner = asyncio.create_task(executor.run(stop))
    started = time.monotonic()
    try:
        while db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'") < total:
            assert not runner.done(), runner
            assert time.monotonic() - started < limit, "the executor stalled"
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
    # A poll of an hour: an action that ends within the test's minute was woken by the NOTIFY.
    executor = db.executor(poll_seconds=3600.0)
    runner = asyncio.create_task(executor.run(stop))
    try:
        await listening(db, 1)
        await asyncio.sleep(0.5)  # idle: its first claim found nothing
        with db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "wake-me"))
            conn.commit()
        deadline = time.monotonic() + 60
        while db.scalar("SELECT state FROM {schema}.agent_action") != "DONE":
            assert time.monotonic() < deadline, "the notification did not wake the executor"
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await runner
        await executor.close()


async def test_the_next_head_of_a_kind_with_a_slot_limit_does_not_wait_out_the_last_lease(
    db: OutboxTestDatabase,
) -> None:
    """A kind with a slot limit is outside the chained claims, so the ending of a lane's head
    leaves its next head to the claim loop. The lane row still said the ended head's lease
    (an hour here; 300 s by default), and the next head waited that long: one action per
    lease. The poll is an hour too, so the ending itself must wake the claim loop."""
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn, [ActionRequest("TEST_FENCED", f"lane-{i % 2}", f"k-{i}") for i in range(6)]
        )
        conn.commit()
    await run_until_done(
        db,
        6,
        lease_seconds=3600.0,
        fence_margin_seconds=1.0,
        poll_seconds=3600.0,
        kind_concurrency={"TEST_FENCED": 4},
    )


async def test_a_lane_whose_kinds_two_executors_split_hands_over_within_a_poll(
    db: OutboxTestDatabase,
) -> None:
    """`outbox run --kinds`: one executor serves TEST_NOOP, another TEST_FENCED, and a lane
    holds one of each. The first one's ending chained into a head it may not run and left the
    lane at its own lease (an hour here); the other executor found it only when that lease
    was over."""
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "shared", "first"))
        db.outbox.enqueue(conn, ActionRequest("TEST_FENCED", "shared", "second"))
        conn.commit()
    settings = db.settings.model_copy(
        update={"lease_seconds": 3600.0, "fence_margin_seconds": 1.0, "poll_seconds": 0.5}
    )
    executors = [
        Executor(db.outbox, db.url, settings=settings, kinds=[kind])
        for kind in ("TEST_NOOP", "TEST_FENCED")
    ]
    stop = asyncio.Event()
    runners = [asyncio.create_task(executor.run(stop)) for executor in executors]
    started = time.monotonic()
    try:
        while db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'") < 2:
            assert time.monotonic() - started < 60, "the second head waited for the first's lease"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*runners)
        for executor in executors:
            await executor.close()


class SlowEnded(ActionAdapter):
    """Done, with an ``ended`` hook slow enough to stop the executor while its batch of
    endings is being written."""

    kind = "TEST_SLOW_ENDED"
    instance_level = True
    hook_started: ClassVar[asyncio.Event | None] = None

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()

    async def ended(self, conn: Any, action: Any) -> None:
        assert SlowEnded.hook_started is not None
        SlowEnded.hook_started.set()
        await asyncio.sleep(1.0)


class Effect(ActionAdapter):
    """Notes each run, and whether its adapter had been closed by then."""

    kind = "TEST_EFFECT"
    instance_level = True
    runs: ClassVar[list[tuple[int, bool]]] = []
    closed: ClassVar[bool] = False

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        await asyncio.sleep(0.2)
        Effect.runs.append((attempt.id, Effect.closed))
        return Done()

    async def aclose(self) -> None:
        Effect.closed = True


async def stop_while_a_chaining_batch_is_written(
    db: OutboxTestDatabase, **settings: object
) -> tuple[Executor, int]:
    """A lane of a SlowEnded action, then an Effect (one attempt); stop the executor while the
    first action's ending, and the chained claim of the second, is being written. Returns the
    stopped executor (not closed) and the second action's id."""
    db.register_kind(SlowEnded)
    db.register_kind(Effect)
    SlowEnded.hook_started = asyncio.Event()
    Effect.runs, Effect.closed = [], False
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_SLOW_ENDED", "lane", "first"))
        second = db.outbox.enqueue(
            conn, ActionRequest("TEST_EFFECT", "lane", "second", max_attempts=1)
        ).id
        conn.commit()
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=0.2, **settings)
    runner = asyncio.create_task(executor.run(stop))
    await asyncio.wait_for(SlowEnded.hook_started.wait(), 10)
    stop.set()
    await runner
    return executor, second


async def test_a_stop_while_a_chaining_batch_is_written_waits_for_the_heads_it_claims(
    db: OutboxTestDatabase,
) -> None:
    """SIGTERM while a batch of endings is being written with chaining on: the batch comes
    back with the next heads of its lanes, claimed. They were started after the shutdown had
    stopped waiting, ran on closed adapters, and their endings failed on the closed ender: the
    actions stayed EXECUTING under a lease, to run again after it."""
    executor, second = await stop_while_a_chaining_batch_is_written(db)
    assert not executor.attempts.running
    await executor.close()
    assert Effect.runs == [(second, False)]
    assert db.rows("SELECT state FROM {schema}.agent_action ORDER BY id") == [("DONE",), ("DONE",)]


async def test_close_lowers_the_lanes_that_were_held_when_their_heads_ended(
    db: OutboxTestDatabase,
) -> None:
    """An ending whose lane another transaction held leaves the lane to be lowered later (the
    relower loop, which backs off). close() cancels that loop; it now makes one last try, so
    the next head does not wait for the ended head's lease (300 s here)."""
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "held", "first"))
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "held", "second"))
        conn.commit()
    executor = db.executor(lease_seconds=300.0)
    await executor.open()
    rows, _ = await executor.claims.claim(10)
    assert [row[5] for row in rows if row[0] == "claim"] == ["first"]
    with db.connect() as holder:
        holder.execute(
            f"SELECT 1 FROM \"{db.schema}\".action_lane WHERE lane_key = 'held' FOR UPDATE"
        )
        await asyncio.gather(*executor.attempts.dispatch(rows))
        # Written; the lane was skipped and waits to be lowered.
        await executor.endings.batcher.idle()
        await asyncio.sleep(1.5)  # the relower loop has backed off
        holder.commit()
    await executor.close()
    assert db.scalar("SELECT next_at <= now() FROM {schema}.action_lane WHERE lane_key = 'held'")


async def test_heads_claimed_after_the_shutdown_deadline_are_given_back_unstarted(
    db: OutboxTestDatabase,
) -> None:
    """The deadline passes while the chaining batch is still written: its claimed head is not
    run on adapters being closed, nor left EXECUTING to wait out its lease with its attempt
    spent; it goes back to ADMITTED, due now, its attempt not counted."""
    # The 1 s hook outlasts the 0.1 s deadline.
    executor, second = await stop_while_a_chaining_batch_is_written(db, shutdown_seconds=0.1)
    await executor.close()
    assert Effect.runs == []
    assert db.rows(
        "SELECT state, attempt, due_at <= now() FROM {schema}.agent_action WHERE id = %s",
        (second,),
    ) == [("ADMITTED", 0, True)]
    Effect.closed = False  # the next executor builds its own adapter
    await db.adrain()  # another replica takes it: its one attempt is still there
    assert Effect.runs == [(second, False)]
    assert db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (second,)) == "DONE"
