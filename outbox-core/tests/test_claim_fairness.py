"""A saturated executor still reaches a due lane that is not running: the settle's chained claims
do not keep the places for the lanes that are running.

Found by the chaos run (issue 22; docs/reliability.md): with every place taken, each ending's
chained claim (settle_v1) gave the freed place to the next action of the same lane, so the claim
loop never had a free place, and a due lane outside the running ones (a new lane, a lane whose
head was given back or reclaimed after a kill) waited until the running lanes' backlogs ran dry:
613 s in a 700 s run, 2,326 heads waiting more than a minute (docs/design/claim.md, "The
bound").

The executor chains only while its last claim round took every due lane it saw; while due lanes
were left behind, it still chains most freed places (chaining none halved the throughput) but
gives one in CLAIM_SHARE to the claim loop, whose round takes the earliest due lanes.

The test counts executions, not seconds: the late lane's action must be among the first few.
"""

from __future__ import annotations

import asyncio

import pytest

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.executor import Executor
from outbox_core.executor.endings import CLAIM_SHARE, Endings
from outbox_core.executor.outcomes import Ending
from outbox_core.executor.runtime import Runtime
from outbox_core.states import ActionState
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
    # Behind at most: the PLACES actions running when it was enqueued; the places chained
    # before the claim loop is given one (CLAIM_SHARE - 1 in CLAIM_SHARE, in batches of up to
    # PLACES endings, so up to CLAIM_SHARE * PLACES); and a round that takes a running lane
    # first, when that lane was lowered by a settle that began before the enqueue (PLACES).
    bound = (CLAIM_SHARE + 2) * PLACES
    assert waited <= bound, f"the late lane ran after {waited} other actions"


async def test_a_saturated_executor_gives_one_freed_place_in_claim_share_to_the_claim_loop(
    db: OutboxTestDatabase,
) -> None:
    """While the claim rounds leave due lanes behind, the endings chain most freed places (a
    chained claim is cheap: it goes to a known lane) and leave one in CLAIM_SHARE to the claim
    loop, whose round takes the earliest due lanes; with no backlog, every batch chains."""
    runtime = Runtime(db.outbox, db.url, db.settings, None, {"TEST_NOOP": NoopAdapter()})
    endings = Endings(runtime, chained=lambda rows: None)
    runtime.claim_backlog = True
    singles = [endings._chains(1) for _ in range(4 * CLAIM_SHARE * 10)]
    assert singles.count(False) == 10 * CLAIM_SHARE
    assert "False, False" not in str(singles)  # given places spread out, never in a run
    # Batches of any size: the places given stay one in CLAIM_SHARE, give or take a batch.
    sizes = [1, 7, 30, 2, 500, 3, 64] * 20
    given = sum(size for size in sizes if not endings._chains(size))
    assert abs(given - sum(sizes) / CLAIM_SHARE) <= 500 + 30
    runtime.claim_backlog = False
    assert all(endings._chains(size) for size in sizes)
    # A new backlog starts its count afresh: its first batch chains.
    runtime.claim_backlog = True
    assert endings._chains(1000)
    assert not endings._chains(1)


async def test_a_batch_whose_write_fails_counts_no_place(db: OutboxTestDatabase) -> None:
    """A failed write (written again by the retries, or one by one after a hook failed) gave
    no place to anyone: the share counts only the tries that were written."""
    runtime = Runtime(db.outbox, db.url, db.settings, None, {"TEST_NOOP": NoopAdapter()})
    endings = Endings(runtime, chained=lambda rows: None)  # no pool: every write fails
    runtime.chaining = runtime.claim_backlog = True
    batch = [
        Ending(1, "TEST_NOOP", "lane", 1, ActionState.EXECUTING, ActionState.DONE, "COMPLETED")
    ]
    for counts in ((3, 1), (4, 1)):  # the next batch chains; the next batch is given
        endings._chained_places, endings._given_places = counts
        with pytest.raises(RuntimeError):
            await endings._write(batch)
        assert (endings._chained_places, endings._given_places) == counts
