"""A proposal holds its lane: the lane's head is its first live action (PROPOSED, ADMITTED or
EXECUTING) in id order, and a PROPOSED head is never claimed; it blocks its lane until it is
admitted or refused (migration 0011)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.erasure import erase_subject
from outbox_core.status import collect_status
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter

LANE = "lane-L"


async def done(attempt: ActionAttempt) -> AdapterResult:
    return Done()


def enqueue(db: OutboxTestDatabase, key: str, **fields: Any) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", LANE, key, **fields)).id
        conn.commit()
    return action_id


def states(db: OutboxTestDatabase) -> list[tuple[int, str, int]]:
    return db.rows(
        "SELECT id, state, attempt FROM {schema}.agent_action WHERE lane_key = %s ORDER BY id",
        (LANE,),
    )


def a_proposal_and_an_action_behind_it(db: OutboxTestDatabase, **proposal: Any) -> tuple[int, int]:
    ScriptedAdapter.script = done
    p1 = enqueue(db, "p1", proposed=True, **proposal)
    a2 = enqueue(db, "a2")
    assert p1 < a2
    return p1, a2


def claim_now(db: OutboxTestDatabase) -> list[tuple[str, int]]:
    """One claim as an executor makes it, without drain()'s making everything due first: what
    is claimable right now."""
    flt = db.outbox.registry.filter()
    return db.rows(
        "SELECT op, id FROM {schema}.claim_v1(10, interval '5 minutes', %s::text[], "
        "%s::jsonpath[], %s::text[]) WHERE op <> 'visited'",
        (flt.kinds, flt.paths, flt.suffixes),
    )


async def test_a_proposal_holds_its_lane_until_admitted_and_then_runs_first(
    db: OutboxTestDatabase,
) -> None:
    p1, a2 = a_proposal_and_an_action_behind_it(db)
    await db.adrain()
    assert ScriptedAdapter.calls == []
    assert states(db) == [(p1, "PROPOSED", 0), (a2, "ADMITTED", 0)]
    with db.connect() as conn:
        assert db.outbox.admit(conn, p1)
        conn.commit()
    await db.adrain()
    assert [call["id"] for call in ScriptedAdapter.calls] == [p1, a2]
    assert states(db) == [(p1, "DONE", 1), (a2, "DONE", 1)]


async def test_a_refused_proposal_frees_its_lane_at_once(db: OutboxTestDatabase) -> None:
    p1, a2 = a_proposal_and_an_action_behind_it(db)
    await db.adrain()
    assert claim_now(db) == []  # the lane was looked at: it waits for the proposal
    conn = await db.aconnect()
    async with conn:
        cancelled = await db.outbox.acancel(conn, p1, "REFUSED")
        await conn.commit()
    assert cancelled is not None and str(cancelled.state) == "CANCELLED"
    # Claimable at once, not after a look that the lane row put off.
    assert claim_now(db) == [("claim", a2)]


async def test_an_erased_proposal_frees_its_lane_at_once(db: OutboxTestDatabase) -> None:
    _p1, a2 = a_proposal_and_an_action_behind_it(db, subject_account_id="person-1")
    await db.adrain()
    assert claim_now(db) == []
    conn = await db.aconnect()
    async with conn:
        report = await erase_subject(conn, "person-1", outbox=db.outbox)
        await conn.commit()
    assert report.actions == 1
    assert claim_now(db) == [("claim", a2)]


async def test_an_erasure_of_a_proposal_whose_lane_has_no_row_does_not_wait_for_one(
    db: OutboxTestDatabase,
) -> None:
    """An older build enqueued a proposal alone in its lane without a lane row."""
    p1 = enqueue(db, "p1", proposed=True, subject_account_id="person-2")
    db.execute("DELETE FROM {schema}.action_lane WHERE lane_key = %s", (LANE,))
    conn = await db.aconnect()
    async with conn:
        report = await erase_subject(conn, "person-2", outbox=db.outbox, lock_wait_seconds=5)
        await conn.commit()
    assert report.actions == 1
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE id = %s", (p1,)) == 0


async def test_the_gauges_and_status_count_a_lane_that_a_proposal_holds(
    db: OutboxTestDatabase,
) -> None:
    p1, _a2 = a_proposal_and_an_action_behind_it(db)
    with db.connect() as conn:
        report = collect_status(conn, db.outbox)
    kinds = {kind.kind: kind for kind in report.kinds}
    assert kinds["TEST_SCRIPTED"].lanes_blocked == 1
    assert kinds["TEST_SCRIPTED"].proposed == 1
    [blocked] = report.blocked
    assert (blocked.lane_key, blocked.head_id, blocked.head_state) == (LANE, p1, "PROPOSED")
    assert blocked.head_due is None and not blocked.foreign_head
    async with db.executor() as executor:
        snapshot = await executor.sample_backlog()
    assert snapshot.lanes_blocked == {"TEST_SCRIPTED": 1}
    assert snapshot.proposed["TEST_SCRIPTED"] == 1


def test_an_admitted_proposal_keeps_its_not_before(db: OutboxTestDatabase) -> None:
    later = db.scalar("SELECT now() + interval '1 hour'")
    p1 = enqueue(db, "p1", proposed=True, not_before=later)
    with db.connect() as conn:
        assert db.outbox.admit(conn, p1)
        conn.commit()
    assert db.scalar("SELECT due_at FROM {schema}.agent_action WHERE id = %s", (p1,)) == later
    assert db.scalar(
        "SELECT next_at >= %s FROM {schema}.action_lane WHERE lane_key = %s",
        (later - timedelta(seconds=1), LANE),
    )
