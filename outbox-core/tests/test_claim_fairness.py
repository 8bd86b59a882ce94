"""A saturated executor still reaches a due lane that is not running: the settle's chained claims
do not keep the places for the lanes that are running.

Found by the chaos run (issue 22; docs/reliability.md): with every place taken, each ending's
chained claim (settle_v1) gave the freed place to the next action of the same lane, so the claim
loop never had a free place, and a due lane outside the running ones (a new lane, a lane whose
head was given back or reclaimed after a kill) waited until the running lanes' backlogs ran dry:
613 s in a 700 s run, 2,326 heads waiting more than a minute. The executor now chains only while
its last claim round took every due lane it saw; when due lanes were left behind, a freed lane
is lowered to now and queues behind them (docs/design/claim.md, "The bound").

The test counts executions, not seconds: the late lane's action must be among the first few.
"""

from __future__ import annotations

import asyncio

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.executor import Executor
from outbox_core.testing import OutboxTestDatabase

from .kinds import NoopAdapter

BACKLOG = 40  # actions in each running lane
PLACES = 2


class Recording(NoopAdapter):
    def __init__(self) -> None:
        self.order: list[str] = []

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        self.order.append(attempt.lane_key)
        await asyncio.sleep(0.002)
        return Done()


async def test_a_due_lane_is_claimed_while_running_lanes_have_a_backlog(
    db: OutboxTestDatabase,
) -> None:
    busy = [f"busy-{n}" for n in range(PLACES)]
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn,
            [
                ActionRequest("TEST_NOOP", lane, f"{lane}-{i}")
                for i in range(BACKLOG)
                for lane in busy
            ],
        )
        conn.commit()
    recording = Recording()
    settings = db.settings.model_copy(
        update={"concurrency": PLACES, "claim_batch": PLACES, "poll_seconds": 0.2}
    )
    executor = Executor(db.outbox, db.url, settings=settings, adapters={"TEST_NOOP": recording})
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        while len(recording.order) < 2 * PLACES:  # the busy lanes are chaining
            assert not runner.done(), runner
            await asyncio.sleep(0.01)
        with db.connect() as conn:
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "late", "late-1"))
            conn.commit()
        started = len(recording.order)
        while "late" not in recording.order and len(recording.order) < PLACES * BACKLOG:
            assert not runner.done(), runner
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await runner
        await executor.close()
    assert "late" in recording.order
    waited = recording.order.index("late") - started
    # Due behind at most the running lanes' next heads: a claim round or two.
    assert waited <= 4 * PLACES, f"the late lane ran after {waited} other actions"
