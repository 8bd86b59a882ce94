"""`outbox retry` as functions: a FAILED or CANCELLED action runs again as a new action with
the kept payload, lane and subject under ``<key>#retry-<n>``, linked both ways in the audit;
refused for UNCERTAIN, for an at-most-once kind whose write started, twice, and once the
payload is gone."""

from __future__ import annotations

import pytest

from outbox_core import ActionRequest
from outbox_core.operator import OperatorRefused, cancel_unstarted, resolve_absent, retry
from outbox_core.operator_changes import Resolution, change_many
from outbox_core.testing import OutboxTestDatabase

from .operator_support import (
    audits,
    ended_by_executor,
    failed_before_writing,
    fence_then_failed,
    fence_then_uncertain,
    row,
)


async def test_retry_enqueues_a_new_action_with_the_kept_payload_lane_subject_and_derived_key(
    db: OutboxTestDatabase,
) -> None:
    old = await ended_by_executor(
        db, fence_then_failed, "k1", payload={"n": 7, "note": "x"}, subject="acct-1"
    )
    assert row(db, old)[3] is None  # the ended row keeps no payload
    async with await db.aconnect() as conn:
        new = await retry(conn, db.outbox, old, "provider fixed", "ana")
    assert (new.kind, new.lane_key, new.idempotency_key, new.state) == (
        "TEST_SCRIPTED",
        "lane-k1",
        "k1#retry-1",
        "ADMITTED",
    )
    assert new.payload == {"n": 7, "note": "x"} and new.subject_account_id == "acct-1"
    assert audits(db, old) == [
        ("ana", "retry", "provider fixed", "api", "FAILED", "FAILED", new.id, None)
    ]
    assert audits(db, new.id) == [
        ("ana", "retry", "provider fixed", "api", None, "ADMITTED", old, None)
    ]
    # The retry fails too, and is run again: the number goes on from its own key.
    await db.adrain()
    async with await db.aconnect() as conn:
        again = await retry(conn, db.outbox, new.id, "once more", "ana")
    assert again.idempotency_key == "k1#retry-2"


async def test_a_cancelled_action_is_run_again_too(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        request = ActionRequest("TEST_SCRIPTED", "lane-c", "c1", payload={"n": 3})
        action_id = db.outbox.enqueue(conn, request).id
        conn.commit()
    async with await db.aconnect() as conn:
        await cancel_unstarted(conn, db.outbox, action_id)
        new = await retry(conn, db.outbox, action_id, "cancelled by mistake")
    assert new.payload == {"n": 3} and new.idempotency_key == "c1#retry-1"


async def test_retry_is_refused_for_an_uncertain_action_until_it_is_resolved(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "u1")
    async with await db.aconnect() as conn:
        with pytest.raises(OperatorRefused, match="is UNCERTAIN: .*resolve it first"):
            await retry(conn, db.outbox, action_id, "why")
        await resolve_absent(conn, db.outbox, action_id, "checked: not there")
        new = await retry(conn, db.outbox, action_id, "send it")
    assert new.idempotency_key == "u1#retry-1"


async def test_retry_is_refused_for_an_at_most_once_kind_whose_write_started(
    db: OutboxTestDatabase,
) -> None:
    wrote = await ended_by_executor(db, fence_then_failed, "o1", kind="TEST_ONCE")
    unwritten = await ended_by_executor(db, failed_before_writing, "o2", kind="TEST_ONCE")
    async with await db.aconnect() as conn:
        with pytest.raises(OperatorRefused, match="at-most-once kind and its write started"):
            await retry(conn, db.outbox, wrote, "why")
        new = await retry(conn, db.outbox, unwritten, "never written")
    assert new.idempotency_key == "o2#retry-1"
    assert audits(db, wrote) == []


async def test_an_at_most_once_action_resolved_absent_may_run_again(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "o3", kind="TEST_ONCE")
    async with await db.aconnect() as conn:
        await resolve_absent(conn, db.outbox, action_id, "relay log: never accepted")
        new = await retry(conn, db.outbox, action_id, "send it")
    assert new.kind == "TEST_ONCE" and new.state == "ADMITTED"


async def test_retry_is_refused_twice_and_after_the_payload_is_gone(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, failed_before_writing, "t1")
    old_one = await ended_by_executor(db, failed_before_writing, "t2")
    # As an action that ended before migration 0018 kept payloads.
    db.execute("DELETE FROM {schema}.action_kept_payload WHERE action_id = %s", (old_one,))
    async with await db.aconnect() as conn:
        new = await retry(conn, db.outbox, action_id, "once")
        with pytest.raises(OperatorRefused, match=f"run again already as action {new.id}"):
            await retry(conn, db.outbox, action_id, "twice")
        with pytest.raises(OperatorRefused, match="keeps no payload"):
            await retry(conn, db.outbox, old_one, "why")
        db.execute("DELETE FROM {schema}.agent_action WHERE id = %s", (old_one,))
        with pytest.raises(OperatorRefused, match="retention or an erasure deletes an action"):
            await retry(conn, db.outbox, old_one, "why")


async def test_retry_many_dry_run_shows_the_new_keys_and_writes_nothing(
    db: OutboxTestDatabase,
) -> None:
    first = await ended_by_executor(db, failed_before_writing, "d1")
    second = await ended_by_executor(db, failed_before_writing, "d2")
    count = "SELECT count(*) FROM {schema}.agent_action"
    before = db.scalar(count)
    async with await db.aconnect() as conn:
        plan = await change_many(
            conn, db.outbox, [first, second], Resolution.RETRY, "why", dry_run=True
        )
        assert [c.new_key for c in plan.changes] == ["d1#retry-1", "d2#retry-1"]
        assert db.scalar(count) == before and not plan.written
        done = await change_many(conn, db.outbox, [first, second], Resolution.RETRY, "why")
    assert done.written and db.scalar(count) == before + 2
    assert [c.new_action.idempotency_key for c in done.changes if c.new_action] == [
        "d1#retry-1",
        "d2#retry-1",
    ]
