"""Expiry, the reaper, retention, erasure, cancel and run_now; ended() for every way of ending."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, ClassVar

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done, StopReason
from outbox_core.erasure import erase_subject
from outbox_core.testing import OutboxTestDatabase

from .kinds import AtMostOnceAdapter, NoopAdapter, ScriptedAdapter


def enqueue(
    db: OutboxTestDatabase,
    key: str,
    *,
    kind: str = "TEST_SCRIPTED",
    lane: str = "lane",
    **fields: Any,
) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest(kind, lane, key, **fields)).id
        conn.commit()
    return action_id


def db_now(db: OutboxTestDatabase) -> Any:
    return db.scalar("SELECT now()")


async def wait_until_past(db: OutboxTestDatabase, moment: Any) -> None:
    for _ in range(200):
        if db.scalar("SELECT now() > %s", (moment,)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the database clock never passed the moment")


async def done(attempt: ActionAttempt) -> AdapterResult:
    return Done()


async def test_an_action_that_expired_before_it_started_ends_cancelled_and_never_runs(
    db: OutboxTestDatabase,
) -> None:
    ScriptedAdapter.script = done
    expires = db_now(db) + timedelta(milliseconds=300)
    head = enqueue(db, "head", expires_at=expires)
    behind = enqueue(db, "behind", expires_at=expires, lane="lane")
    await wait_until_past(db, expires)
    await db.adrain()
    assert db.rows("SELECT state, stop_reason FROM {schema}.agent_action ORDER BY id") == [
        ("CANCELLED", StopReason.EXPIRED),
        ("CANCELLED", StopReason.EXPIRED),
    ]
    assert ScriptedAdapter.calls == []
    assert sorted(e[0] for e in ScriptedAdapter.endings) == [head, behind]


async def test_an_at_most_once_action_whose_lease_ran_out_after_its_write_started_ends_uncertain(
    db: OutboxTestDatabase,
) -> None:
    async def fence_then_vanish(attempt: ActionAttempt) -> AdapterResult:
        assert await attempt.fence().begin_write()
        # The replica dies here: its lease runs out with the write started.
        db.execute(
            "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 s' WHERE id = %s",
            (attempt.id,),
        )
        raise asyncio.CancelledError

    AtMostOnceAdapter.script = fence_then_vanish
    action_id = enqueue(db, "once", kind="TEST_ONCE")
    async with db.executor() as executor:
        rows, _ = await executor._claim(10)
        await asyncio.gather(*executor._dispatch(rows), return_exceptions=True)
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "EXECUTING"
    AtMostOnceAdapter.script = done
    await db.adrain()
    assert db.rows("SELECT state, stop_reason FROM {schema}.agent_action") == [
        ("UNCERTAIN", StopReason.LEASE_LOST_AFTER_WRITE)
    ]
    assert len(AtMostOnceAdapter.calls) == 1
    assert AtMostOnceAdapter.endings == [
        (action_id, "UNCERTAIN", StopReason.LEASE_LOST_AFTER_WRITE)
    ]


async def test_a_crashed_last_attempt_is_reaped_instead_of_claimed_past_its_attempts(
    db: OutboxTestDatabase,
) -> None:
    action_id = enqueue(db, "last", max_attempts=1)
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() - interval '1 s' WHERE id = %s",
        (action_id,),
    )
    ScriptedAdapter.script = done
    await db.adrain()
    assert db.rows("SELECT state, stop_reason, attempt FROM {schema}.agent_action") == [
        ("FAILED", StopReason.ATTEMPTS_EXHAUSTED, 1)
    ]
    assert ScriptedAdapter.calls == []


async def test_retention_deletes_old_ended_actions_but_keeps_an_opted_out_kind(
    db: OutboxTestDatabase,
) -> None:
    class KeptAdapter(NoopAdapter):
        kind = "TEST_KEPT"
        retained: ClassVar[bool] = False

    db.register_kind(KeptAdapter)
    for index in range(3):
        enqueue(db, f"noop-{index}", kind="TEST_NOOP")
    kept = enqueue(db, "kept", kind="TEST_KEPT")
    live = enqueue(db, "live", kind="TEST_SCRIPTED", not_before=db_now(db) + timedelta(hours=1))
    await db.adrain()
    db.execute(
        "UPDATE {schema}.agent_action SET due_at = now() + interval '1 hour' WHERE id = %s", (live,)
    )
    ended = db.scalar("SELECT max(ended_at) FROM {schema}.agent_action")
    await wait_until_past(db, ended + timedelta(milliseconds=200))
    async with db.executor(retention_days=0.1 / 86400) as executor:
        assert await executor.sweep_retention() == 3
    assert sorted(r[0] for r in db.rows("SELECT id FROM {schema}.agent_action")) == [kept, live]


async def test_an_erased_pending_action_never_runs_and_the_action_behind_it_does(
    db: OutboxTestDatabase,
) -> None:
    ScriptedAdapter.script = done
    erased = enqueue(db, "erased", subject_account_id="person-9")
    behind = enqueue(db, "behind")
    conn = await db.aconnect()
    async with conn:
        report = await erase_subject(conn, "person-9", outbox=db.outbox)
        await conn.commit()
    assert report.actions == 1
    await db.adrain()
    assert [c["id"] for c in ScriptedAdapter.calls] == [behind]
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE id = %s", (erased,)) == 0


async def test_an_operator_cancel_ends_only_an_unstarted_action_and_calls_ended(
    db: OutboxTestDatabase,
) -> None:
    ScriptedAdapter.script = done
    first = enqueue(db, "first")
    conn = await db.aconnect()
    async with conn:
        cancelled = await db.outbox.cancel(conn, first)
        await conn.commit()
        assert cancelled is not None and cancelled.stop_reason == StopReason.OPERATOR_CANCELLED
        assert await db.outbox.cancel(conn, first) is None  # already ended
    assert ScriptedAdapter.endings == [(first, "CANCELLED", StopReason.OPERATOR_CANCELLED)]


async def test_ended_runs_for_every_way_of_ending(db: OutboxTestDatabase) -> None:
    """Attempt, expiry, reaper and operator cancel each call the kind's ended() once."""
    AtMostOnceAdapter.script = done
    by_attempt = enqueue(db, "a", kind="TEST_ONCE", lane="l1")
    expires = db_now(db) + timedelta(milliseconds=200)
    by_expiry = enqueue(db, "b", kind="TEST_ONCE", lane="l2", expires_at=expires)
    by_reaper = enqueue(
        db, "c", kind="TEST_ONCE", lane="l3", not_before=db_now(db) + timedelta(hours=1)
    )
    by_cancel = enqueue(
        db, "d", kind="TEST_ONCE", lane="l4", not_before=db_now(db) + timedelta(hours=1)
    )
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() - interval '1 s', write_started_at = now() WHERE id = %s",
        (by_reaper,),
    )
    conn = await db.aconnect()
    async with conn:
        await db.outbox.cancel(conn, by_cancel)
        await conn.commit()
    await wait_until_past(db, expires)
    await db.adrain()
    assert sorted(AtMostOnceAdapter.endings) == sorted(
        [
            (by_attempt, "DONE", StopReason.COMPLETED),
            (by_expiry, "CANCELLED", StopReason.EXPIRED),
            (by_reaper, "UNCERTAIN", StopReason.LEASE_LOST_AFTER_WRITE),
            (by_cancel, "CANCELLED", StopReason.OPERATOR_CANCELLED),
        ]
    )


async def test_run_now_carries_out_an_admitted_lane_head_at_once(db: OutboxTestDatabase) -> None:
    ScriptedAdapter.script = done
    later = db_now(db) + timedelta(hours=1)
    head = enqueue(db, "head", not_before=later)
    behind = enqueue(db, "behind")
    async with db.executor() as executor:
        assert await executor.run_now(behind) is None  # not the lane's head
        action = await executor.run_now(head)
    assert action is not None and str(action.state) == "DONE"
    assert [c["id"] for c in ScriptedAdapter.calls] == [head]
