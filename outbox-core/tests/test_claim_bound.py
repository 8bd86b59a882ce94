"""A due lane is claimed within a bounded number of claim rounds, however long the backlog.

Issue 22, defect 1: a lane whose head ends while a producer's enqueue holds its row is skipped
by the settle's chained claim, lowered again once the enqueue commits, and loses its head kind.
claim_v1 took such lanes only after every due lane of a known kind, so under a backlog the lane
waited until the backlog ran dry. The bound (docs/design/claim.md, "The bound"): a lane that is
due and not held by another transaction is claimed within ceil(A / limit) + 1 rounds, where A is
the number of due lanes whose next look is no later than its own when it became due; the lanes
that fall due after it do not count.

Real concurrency: the producer holds the lane's row on its own connection while the settle runs
on another, and two producer threads keep enqueueing (into new lanes and into running lanes)
while the claim rounds run. The test counts claim rounds, not seconds.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

CONTENDED = "lane-contended"
LIMIT = 4
RUNNING = 12
AHEAD = 10
BEHIND = 200
MAX_ROUNDS = 400
ARGS = "interval '5 minutes', ARRAY['TEST_NOOP'], ARRAY[NULL]::jsonpath[], ARRAY[NULL]::text[]"


def _claim(conn: Any, schema: str, limit: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = conn.execute(
        f"SELECT op, id, epoch, lane_key FROM {schema}.claim_v1(%s, {ARGS})", (limit,)
    ).fetchall()
    return rows


def test_a_due_lane_of_unknown_head_is_claimed_within_the_claim_bound(
    db: OutboxTestDatabase,
) -> None:
    schema = f'"{db.schema}"'
    outbox = db.outbox
    with db.connect(autocommit=True) as claimer, db.connect(autocommit=True) as settler:
        # The contended lane and the running lanes: their heads are claimed (the executor is
        # full; nothing below ends them).
        first = outbox.enqueue(claimer, ActionRequest("TEST_NOOP", CONTENDED, "x-1"))
        running = [f"running-{n}" for n in range(RUNNING)]
        outbox.enqueue_many(
            claimer, [ActionRequest("TEST_NOOP", lane, f"{lane}-head") for lane in running]
        )
        claimed = _claim(claimer, schema, RUNNING + 1)
        epoch = next(row[2] for row in claimed if row[1] == first.id)
        # Lanes that fell due before the contended lane will.
        outbox.enqueue_many(
            claimer, [ActionRequest("TEST_NOOP", f"ahead-{n}", f"ahead-{n}") for n in range(AHEAD)]
        )

        # A producer's enqueue_many holds the contended lane's row while its head ends.
        with db.connect() as producer:
            outbox.enqueue_many(producer, [ActionRequest("TEST_NOOP", CONTENDED, "x-2")])
            settled = settler.execute(
                f"SELECT op, lane_key, due_at, last_result FROM {schema}.settle_v1("
                "ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY['EXECUTING'], ARRAY['DONE'], "
                "ARRAY['COMPLETED'], ARRAY[NULL], ARRAY[0.0], ARRAY['keep'], "
                "ARRAY[NULL]::timestamptz[], ARRAY[0], ARRAY['Done'], true, "
                f"{ARGS})",
                (first.id, epoch),
            ).fetchall()
            skipped = [row for row in settled if row[0] == "skipped"]
            assert [(row[1], row[3]) for row in skipped] == [(CONTENDED, "cleared")], settled
            assert not [row for row in settled if row[0] == "claim"], "the settle chained it"
            producer.commit()
        # The executor's relower path, after the settle committed.
        left = settler.execute(
            outbox.queries["lower_lanes"],
            {"lanes": [CONTENDED], "at": [skipped[0][2]], "cleared": [True]},
        ).fetchall()
        assert left == []
        head_kind, next_at = settler.execute(
            f"SELECT head_kind, next_at FROM {schema}.action_lane WHERE lane_key = %s",
            (CONTENDED,),
        ).fetchone() or (None, None)
        assert head_kind is None
        ahead = settler.execute(
            f"SELECT count(*) FROM {schema}.action_lane WHERE lane_key <> %s AND next_at <= %s",
            (CONTENDED, next_at),
        ).fetchone()
        assert ahead is not None
        bound = -(-int(ahead[0]) // LIMIT) + 1

        # A backlog of lanes of a known kind that fall due after it, and producers that keep
        # adding to it and to the running lanes while the claim rounds run.
        outbox.enqueue_many(
            settler,
            [ActionRequest("TEST_NOOP", f"behind-{n}", f"behind-{n}") for n in range(BEHIND)],
        )
        stop = threading.Event()
        errors: list[BaseException] = []
        counter = itertools.count()

        def produce(name: str) -> None:
            try:
                with db.connect(autocommit=True) as conn:
                    while not stop.is_set():
                        n = next(counter)
                        outbox.enqueue_many(
                            conn,
                            [
                                ActionRequest("TEST_NOOP", f"{name}-{n}", f"{name}-new-{n}"),
                                ActionRequest("TEST_NOOP", running[n % RUNNING], f"{name}-r-{n}"),
                            ],
                        )
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(f"p{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        rounds = 0
        taken = False
        try:
            while not taken and rounds < MAX_ROUNDS:
                rounds += 1
                ops = _claim(claimer, schema, LIMIT)
                taken = any(op == "claim" and lane == CONTENDED for op, _, _, lane in ops)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert errors == [], errors
        assert taken and rounds <= bound, (
            f"the contended lane was {'claimed in round' if taken else 'not claimed in'} "
            f"{rounds}; the bound is {bound} "
            f"({ahead[0]} lanes due before it, {LIMIT} a round)"
        )
