"""A claim round with a kind that has a slot limit: the groups share the round's places (a round
never starts more attempts than are free), and the group that goes first turns from round to
round (a kind with a slot limit is not starved while the others have work, nor they by it)."""

from __future__ import annotations

import asyncio

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .test_concurrency import running
from .test_wakeups import until

LIMITED = "TEST_ONCE"  # AtMostOnceAdapter: ScriptedAdapter's script, another kind
FREE = "TEST_SCRIPTED"


def enqueue(db: OutboxTestDatabase, kind: str, count: int) -> None:
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn, [ActionRequest(kind, f"{kind}-{i}", f"{kind}-{i}") for i in range(count)]
        )
        conn.commit()


async def test_a_round_starts_no_more_attempts_than_the_free_places(
    db: OutboxTestDatabase,
) -> None:
    """Each group claimed up to the round's limit on its own: with 4 places and a kind
    limited to 3 slots, a round started 4 of the free kind and 3 of the limited one."""
    running_now: dict[str, int] = {FREE: 0, LIMITED: 0}
    most = {"all": 0, LIMITED: 0}
    gate = asyncio.Event()

    async def script(attempt: ActionAttempt) -> AdapterResult:
        running_now[attempt.kind] += 1
        most["all"] = max(most["all"], sum(running_now.values()))
        most[LIMITED] = max(most[LIMITED], running_now[LIMITED])
        await gate.wait()
        running_now[attempt.kind] -= 1
        return Done()

    ScriptedAdapter.script = script
    enqueue(db, FREE, 8)
    enqueue(db, LIMITED, 8)
    executor = db.executor(concurrency=4, kind_concurrency={LIMITED: 3}, poll_seconds=0.1)
    try:
        async with running(executor):
            await until(lambda: sum(running_now.values()) >= 4, "fewer than 4 started")
            await asyncio.sleep(0.5)  # polls: rounds that find every place taken
            assert most["all"] == 4, most
            gate.set()
            await until(
                lambda: (
                    db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'")
                    == 16
                ),
                "not every action ran",
            )
            assert most["all"] == 4 and most[LIMITED] <= 3, most
    finally:
        gate.set()


async def test_a_kind_with_a_slot_limit_is_not_starved_by_a_backlog_of_others(
    db: OutboxTestDatabase,
) -> None:
    """With the unlimited kinds' group always first, a backlog of them took every place of
    every round, and the limited kind's action waited until that backlog was gone."""
    started: list[str] = []

    async def script(attempt: ActionAttempt) -> AdapterResult:
        started.append(attempt.kind)
        await asyncio.sleep(0.01)
        return Done()

    ScriptedAdapter.script = script
    enqueue(db, FREE, 60)
    enqueue(db, LIMITED, 1)
    executor = db.executor(concurrency=2, claim_batch=2, kind_concurrency={LIMITED: 1})
    async with running(executor):
        await until(lambda: LIMITED in started, "the limited kind never started", seconds=60)
    # Every round of two places turns the order: the limited kind goes first in the second.
    assert started.index(LIMITED) < 10, started.index(LIMITED)
