"""enqueue_many from several connections at once: no deadlock, one action per key, ids in order.

Real concurrency: each batch runs in its own thread on its own connection and commits at once.
The test holds the action table in SHARE mode until every batch's statement waits for it, so all
the batches start inserting at the same moment. Every trial uses fresh keys.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from outbox_core import ActionRequest, Enqueued
from outbox_core.testing import OutboxTestDatabase

from .test_concurrency import wait_for

KEYS = 1_000
LANES = 7
TRIALS = 4


@dataclass(frozen=True)
class Batch:
    keys: list[int]


def _requests(trial: int, batch: Batch) -> list[ActionRequest]:
    return [
        ActionRequest("TEST_NOOP", f"t{trial}-lane-{key % LANES}", f"t{trial}-k{key}")
        for key in batch.keys
    ]


def _run_at_once(
    db: OutboxTestDatabase, batches: Sequence[list[ActionRequest]]
) -> list[list[Enqueued]]:
    answers: list[list[Enqueued] | None] = [None] * len(batches)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            with db.connect() as conn:
                answers[index] = db.outbox.enqueue_many(conn, batches[index])
                conn.commit()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    with db.connect() as gate:
        gate.execute(f'LOCK TABLE "{db.schema}".agent_action IN SHARE MODE')
        for thread in threads:
            thread.start()
        wait_for(
            lambda: _waiting_for_locks(db) >= len(batches), 60, "every batch to wait at the gate"
        )
        gate.commit()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a batch never finished"
    assert errors == [], f"a batch failed: {errors!r}"
    return [answer for answer in answers if answer is not None]


def _waiting_for_locks(db: OutboxTestDatabase) -> int:
    return int(
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
    )


def _check(
    db: OutboxTestDatabase,
    trial: int,
    batches: list[list[ActionRequest]],
    answers: list[list[Enqueued]],
) -> None:
    stored = dict(
        db.rows(
            "SELECT idempotency_key, id FROM {schema}.agent_action WHERE idempotency_key LIKE %s",
            (f"t{trial}-%",),
        )
    )
    wanted = {request.idempotency_key for batch in batches for request in batch}
    # Each key exactly one action (the unique index holds it; every key is there).
    assert set(stored) == wanted
    assert int(
        db.scalar(
            "SELECT count(*) FROM {schema}.agent_action WHERE idempotency_key LIKE %s",
            (f"t{trial}-%",),
        )
    ) == len(wanted)
    created_by: dict[str, int] = {}
    for index, (batch, answer) in enumerate(zip(batches, answers, strict=True)):
        # Every caller, sharing a key or not, is told the one action that holds it.
        assert [a.id for a in answer] == [stored[r.idempotency_key] for r in batch]
        by_lane: dict[str, list[int]] = defaultdict(list)
        for request, enqueued in zip(batch, answer, strict=True):
            if enqueued.created:
                assert request.idempotency_key not in created_by, "two callers made one key"
                created_by[request.idempotency_key] = index
                by_lane[request.lane_key].append(enqueued.id)
        # Within a lane, the actions a batch made are in the batch's order.
        for lane, ids in by_lane.items():
            assert ids == sorted(ids), f"batch {index}: lane {lane} out of the batch's order"
    assert set(created_by) == wanted


SHAPES = {
    "same-keys-forward-and-reverse": lambda: [
        Batch(list(range(KEYS))),
        Batch(list(reversed(range(KEYS)))),
    ],
    "half-overlapping-three-orders": lambda: [
        Batch(list(range(KEYS))),
        Batch(list(reversed(range(KEYS // 2, KEYS + KEYS // 2)))),
        Batch(random.Random(15).sample(range(KEYS // 4, KEYS + KEYS // 4), KEYS)),
    ],
    "shuffled-same-keys": lambda: [
        Batch(random.Random(seed).sample(range(KEYS), KEYS)) for seed in (1, 2, 3)
    ],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_concurrent_enqueue_many_batches_over_the_same_keys_never_deadlock(
    db: OutboxTestDatabase, shape: str
) -> None:
    for trial in range(TRIALS):
        batches = [_requests(trial, batch) for batch in SHAPES[shape]()]
        answers = _run_at_once(db, batches)
        _check(db, trial, batches, answers)
