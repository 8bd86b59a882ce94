"""One EXECUTING action per lane, held by the database against every client: the claim
functions, a takeover of an expired lease, and hand-written SQL from any connection.

The rule is the specification's (the unique index ux_agent_action_lane_executing, or a layout
that keeps it as strictly: issue 34). These tests name no index: they write as a client would
and read the states back, so they hold any layout to the rule and fail if it is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

CLAIM_BY_HAND = (
    "UPDATE {table} SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, "
    "lease_until = now() + interval '5 minutes' WHERE id = %s"
)


def table(db: OutboxTestDatabase) -> str:
    return f'"{db.schema}".agent_action'


def enqueue(db: OutboxTestDatabase, lane: str, key: str) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", lane, key)).id
        conn.commit()
    return action_id


def executing_per_lane(db: OutboxTestDatabase) -> dict[str, int]:
    rows = db.rows(
        f"SELECT lane_key, count(*) FROM {table(db)} WHERE state = 'EXECUTING' GROUP BY lane_key"
    )
    return {lane: int(count) for lane, count in rows}


def claim_params(db: OutboxTestDatabase, limit: int = 10, lease: float = 300.0) -> dict[str, Any]:
    kinds = db.outbox.registry.filter(["TEST_NOOP"])
    return {
        "limit": limit,
        "lease": lease,
        "kinds": kinds.kinds,
        "paths": kinds.paths,
        "suffixes": kinds.suffixes,
        "traced": False,
    }


class ClaimByHand(threading.Thread):
    """A hand-written claim of ``action_id`` on ``conn`` in a thread of its own, committed if
    the database lets it; ``outcome`` is "committed" or the error's class name."""

    def __init__(self, db: OutboxTestDatabase, conn: psycopg.Connection, action_id: int) -> None:
        super().__init__()
        self.db, self.conn, self.action_id = db, conn, action_id
        self.outcome = ""

    def run(self) -> None:
        try:
            self.conn.execute(CLAIM_BY_HAND.format(table=table(self.db)), (self.action_id,))
            self.conn.commit()
            self.outcome = "committed"
        except psycopg.Error as exc:
            self.conn.rollback()
            self.outcome = type(exc).__name__

    def start_and_wait_for_a_lock(self, watch: psycopg.Connection) -> None:
        """Starts; returns once the claim has finished or waits for a lock (another
        transaction's), whichever comes first."""
        pid = self.conn.info.backend_pid
        self.start()
        while self.is_alive():
            row = watch.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)  # a poll, not a timed assertion


@pytest.mark.parametrize("holder_claimed_by", ["hand", "claim function"])
def test_a_hand_written_update_cannot_put_a_second_action_of_a_lane_in_executing(
    db: OutboxTestDatabase, holder_claimed_by: str
) -> None:
    head = enqueue(db, "lane-a", "a-1")
    behind = enqueue(db, "lane-a", "a-2")
    with db.connect(autocommit=True) as conn:
        if holder_claimed_by == "hand":
            conn.execute(CLAIM_BY_HAND.format(table=table(db)), (head,))
        else:
            rows = conn.execute(db.outbox.queries["claim"], claim_params(db)).fetchall()
            assert [(r[0], r[1]) for r in rows if r[0] != "visited"] == [("claim", head)]
        with pytest.raises(psycopg.IntegrityError):
            conn.execute(CLAIM_BY_HAND.format(table=table(db)), (behind,))
    assert executing_per_lane(db) == {"lane-a": 1}


def test_the_next_action_of_a_lane_may_execute_once_its_holder_ended(
    db: OutboxTestDatabase,
) -> None:
    """The rule refuses a second holder, not a next one."""
    head = enqueue(db, "lane-a", "a-1")
    behind = enqueue(db, "lane-a", "a-2")
    with db.connect(autocommit=True) as conn:
        conn.execute(CLAIM_BY_HAND.format(table=table(db)), (head,))
        conn.execute(
            f"UPDATE {table(db)} SET state = 'DONE', stop_reason = 'TEST', payload = NULL "
            "WHERE id = %s",
            (head,),
        )
        conn.execute(CLAIM_BY_HAND.format(table=table(db)), (behind,))
    assert db.rows(f"SELECT id FROM {table(db)} WHERE state = 'EXECUTING'") == [(behind,)]


def test_a_takeover_of_an_expired_lease_leaves_no_room_for_a_second_holder(
    db: OutboxTestDatabase,
) -> None:
    """The reclaim keeps the action EXECUTING under a new epoch; while it is not committed,
    and after, a hand-written claim of the action behind it is refused."""
    head = enqueue(db, "lane-a", "a-1")
    behind = enqueue(db, "lane-a", "a-2")
    with db.connect(autocommit=True) as conn:
        conn.execute(
            f"UPDATE {table(db)} SET state = 'EXECUTING', epoch = epoch + 1, "
            "attempt = attempt + 1, lease_until = now() - interval '1 second' WHERE id = %s",
            (head,),
        )
    with db.connect() as taker, db.connect() as other, db.connect(autocommit=True) as watch:
        reclaimed = [
            (r[0], r[1])
            for r in taker.execute(db.outbox.queries["claim"], claim_params(db))
            if r[0] != "visited"
        ]
        assert reclaimed == [("reclaim", head)]
        during = ClaimByHand(db, other, behind)
        during.start_and_wait_for_a_lock(watch)
        taker.commit()
        during.join()
        after = ClaimByHand(db, other, behind)
        after.start()
        after.join()
    assert during.outcome != "committed"
    assert after.outcome != "committed"
    assert db.rows(f"SELECT id, epoch FROM {table(db)} WHERE state = 'EXECUTING'") == [(head, 2)]


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"])
def test_two_uncommitted_claims_of_two_actions_of_one_lane_cannot_both_commit(
    db: OutboxTestDatabase, isolation: str
) -> None:
    """Neither transaction sees the other's claim; the database must still let one commit
    only, in every isolation level a client may choose."""
    first_id = enqueue(db, "lane-a", "a-1")
    second_id = enqueue(db, "lane-a", "a-2")
    with db.connect() as first, db.connect() as second, db.connect(autocommit=True) as watch:
        for conn in (first, second):
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
            conn.execute("SELECT 1")  # the snapshot, before either claim
        first.execute(CLAIM_BY_HAND.format(table=table(db)), (first_id,))
        claim = ClaimByHand(db, second, second_id)
        claim.start_and_wait_for_a_lock(watch)
        first.commit()
        claim.join()
    assert claim.outcome != "committed"
    assert db.rows(f"SELECT id FROM {table(db)} WHERE state = 'EXECUTING'") == [(first_id,)]


def test_concurrent_claims_and_hand_written_claims_never_leave_two_holders_in_a_lane(
    db: OutboxTestDatabase,
) -> None:
    """Claim functions on four connections, each claim ended (or its lease left to run out, for
    a takeover), and a connection that claims by hand every action it sees ADMITTED: after
    every round, no lane has two executing actions."""
    lanes = 6
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn,
            [ActionRequest("TEST_NOOP", f"lane-{n % lanes}", f"k-{n}") for n in range(60)],
        )
        conn.commit()
    refused: list[str] = []
    overlaps: list[dict[str, int]] = []

    def claimer(worker: int) -> None:
        with db.connect(autocommit=True) as conn:
            for round_ in range(15):
                # A short lease on every third claim: the next claim takes it over.
                lease = 0.001 if (worker + round_) % 3 == 0 else 300.0
                try:
                    rows = conn.execute(
                        db.outbox.queries["claim"], claim_params(db, 3, lease)
                    ).fetchall()
                except psycopg.IntegrityError as exc:
                    # A hand-written claim committed into a lane after this claim's
                    # snapshot: the database refuses the claim's second holder.
                    refused.append(type(exc).__name__)
                    continue
                for row in rows:
                    if row[0] in ("claim", "reclaim") and lease > 1:
                        conn.execute(
                            f"UPDATE {table(db)} SET state = 'DONE', stop_reason = 'TEST', "
                            "payload = NULL WHERE id = %s AND epoch = %s AND state = 'EXECUTING'",
                            (row[1], row[11]),
                        )

    def by_hand() -> None:
        with db.connect(autocommit=True) as conn:
            for _ in range(15):
                admitted = conn.execute(
                    f"SELECT id FROM {table(db)} WHERE state = 'ADMITTED' ORDER BY id DESC LIMIT 5"
                ).fetchall()
                for (action_id,) in admitted:
                    try:
                        conn.execute(
                            CLAIM_BY_HAND.format(table=table(db)) + " AND state = 'ADMITTED'",
                            (action_id,),
                        )
                    except psycopg.IntegrityError as exc:
                        refused.append(type(exc).__name__)
                found = executing_per_lane(db)
                if any(count > 1 for count in found.values()):
                    overlaps.append(found)

    errors: list[BaseException] = []

    def reporting(work: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        return threading.Thread(target=run)

    threads = [reporting(lambda n=n: claimer(n)) for n in range(4)]
    threads.append(reporting(by_hand))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert overlaps == []
    assert all(count == 1 for count in executing_per_lane(db).values())
    # The hand-written claims met holders: the rule refused them (not a lucky schedule).
    assert refused
