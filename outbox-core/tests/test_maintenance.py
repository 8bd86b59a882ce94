"""Expiry, the reaper, retention, erasure, cancel and run_now; ended() for every way of ending."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from outbox_core import (
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Defer,
    Done,
    Reread,
    StopReason,
)
from outbox_core.erasure import erase_subject
from outbox_core.executor import maintenance
from outbox_core.lane_locks import LocksBusy
from outbox_core.testing import OutboxTestDatabase

from .kinds import AtMostOnceAdapter, NoopAdapter, ScriptedAdapter
from .test_concurrency import ascalar, await_for


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
    await await_for(
        lambda: ascalar(db, "SELECT now() > %s", (moment,)),
        60,
        "the database clock to pass the moment",
        interval=0.02,
    )


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
        rows, _ = await executor.claims.claim(10)
        await asyncio.gather(*executor.attempts.dispatch(rows), return_exceptions=True)
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
        cancelled = await db.outbox.acancel(conn, first)
        await conn.commit()
        assert cancelled is not None and cancelled.stop_reason == StopReason.OPERATOR_CANCELLED
        assert await db.outbox.acancel(conn, first) is None  # already ended
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
        await db.outbox.acancel(conn, by_cancel)
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


async def test_run_now_on_a_running_executor_waits_only_for_its_own_action(
    db: OutboxTestDatabase,
) -> None:
    """run_now waited until no attempt of the whole executor ran: behind a 5 s attempt in
    another lane, and under a steady load for ever."""
    release = asyncio.Event()

    async def slow(attempt: ActionAttempt) -> AdapterResult:
        await release.wait()
        return Done()

    ScriptedAdapter.script = slow
    enqueue(db, "slow", lane="other")
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=0.2)
    runner = asyncio.create_task(executor.run(stop))
    try:
        await await_for(
            lambda: ascalar(db, "SELECT state = 'EXECUTING' FROM {schema}.agent_action"),
            30,
            "the other lane's attempt to start",
        )
        # Not due, so that the run loop leaves it to run_now.
        later = db_now(db) + timedelta(hours=1)
        quick = enqueue(db, "quick", kind="TEST_NOOP", lane="mine", not_before=later)
        action = await asyncio.wait_for(executor.run_now(quick), 30.0)
        assert action is not None and str(action.state) == "DONE"
        assert not release.is_set()  # the other lane's attempt still runs
    finally:
        release.set()
        stop.set()
        await runner
        await executor.close()


async def test_an_action_whose_write_started_never_expires_or_cancels_and_reads_back(
    db: OutboxTestDatabase,
) -> None:
    """A deferral after a Reread keeps the fence (the action waits ADMITTED with its write
    started). Past its expiry it must not end CANCELLED/EXPIRED, which says the effect never
    happened, and an operator's cancel must refuse it: it is claimed and reads back."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            if len(ScriptedAdapter.calls) == 2:  # this call is recorded already
                return Defer(timedelta(minutes=5))  # rate-limited while reading back
            return Done("found-by-marker")
        assert await attempt.fence().begin_write()
        return Reread(timedelta(0))

    ScriptedAdapter.script = run
    expires = db_now(db) + timedelta(seconds=2)
    action_id = enqueue(db, "written", expires_at=expires)
    behind = enqueue(db, "behind", expires_at=expires)
    await db.adrain()  # attempt 1: the write, then Reread; attempt 2: Defer while reading back
    assert db.rows(
        "SELECT state, write_started_at IS NOT NULL FROM {schema}.agent_action WHERE id = %s",
        (action_id,),
    ) == [("ADMITTED", True)]
    conn = await db.aconnect()
    async with conn:
        assert await db.outbox.acancel(conn, action_id) is None
        await conn.commit()
    await wait_until_past(db, expires)
    async with db.executor() as executor:
        assert await executor.sweep_expired() == 1  # only the action behind it
    await db.adrain()  # the claim reads it back, however late
    assert db.rows("SELECT id, state, stop_reason FROM {schema}.agent_action ORDER BY id") == [
        (action_id, "DONE", StopReason.COMPLETED),
        (behind, "CANCELLED", StopReason.EXPIRED),
    ]
    assert [(c["attempt"], c["write_started"]) for c in ScriptedAdapter.calls] == [
        (1, False),
        (2, True),
        (2, True),  # a Defer does not count the attempt
    ]


async def test_the_expiry_sweep_reads_the_expiries_since_its_last_and_keeps_that_window_when_its_writes_fail(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between its full passes the expiry sweep reads only the expiries since its last sweep
    (less a margin: none here, so that the test needs no minute's wait). An action that expired
    since is found; a sweep whose endings could not be written leaves the window where it was,
    so that the next sweep finds those actions again rather than an hour later."""
    monkeypatch.setattr(maintenance, "EXPIRY_MARGIN", timedelta(0))
    async with db.executor() as executor:
        assert await executor.sweep_expired(full=True) == 0
        expires = db_now(db) + timedelta(milliseconds=300)
        first = enqueue(db, "first", lane="a", expires_at=expires)
        await wait_until_past(db, expires)
        assert await executor.sweep_expired(full=False) == 1

        expires = db_now(db) + timedelta(milliseconds=300)
        second = enqueue(db, "second", lane="b", expires_at=expires)
        await wait_until_past(db, expires)

        async def unwritten(ending: object) -> bool:
            raise ConnectionError("the database went away under the sweep")

        with monkeypatch.context() as patched:
            patched.setattr(executor.maintenance.endings, "submit", unwritten)
            with pytest.raises(ConnectionError):
                await executor.sweep_expired(full=False)
        assert await executor.sweep_expired(full=False) == 1
    assert db.rows("SELECT id, state, stop_reason FROM {schema}.agent_action ORDER BY id") == [
        (first, "CANCELLED", StopReason.EXPIRED),
        (second, "CANCELLED", StopReason.EXPIRED),
    ]


class _PauseAfter:
    """An async connection that runs ``then`` right after one given statement: to hold an
    erasure between two of its statements while another transaction moves."""

    def __init__(self, conn: Any, query: str, then: Any) -> None:
        self._conn, self._query, self._then = conn, query, then

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        cursor = await self._conn.execute(query, params, **kwargs)
        if query == self._query:
            await self._then()
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_an_erasure_beside_a_claim_of_the_same_lane_does_not_deadlock(
    db: OutboxTestDatabase,
) -> None:
    """A claim takes the lane, then its head's row. An erasure that deleted the head first and
    then waited for the lane met a claim waiting for that row: PostgreSQL broke the deadlock by
    failing one of them. Erasure now takes the lanes first."""
    ScriptedAdapter.script = done
    erased = enqueue(db, "erased", subject_account_id="person-7")
    behind = enqueue(db, "behind")
    kinds = db.outbox.registry.filter(["TEST_SCRIPTED"])
    params = {
        "limit": 10,
        "lease": 300.0,
        "kinds": kinds.kinds,
        "paths": kinds.paths,
        "suffixes": kinds.suffixes,
        "traced": False,
    }
    claimed: list[Any] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            with db.connect(autocommit=True) as claimer:
                claimed.extend(claimer.execute(db.outbox.queries["claim"], params).fetchall())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    claimer: list[asyncio.Future[None]] = []

    async def claim_meanwhile() -> None:
        claimer.append(asyncio.ensure_future(asyncio.to_thread(claim)))
        # The claim skips the lane the erasure holds, and returns while the erasure waits here;
        # a claim that waits for a row lock waits here until the timeout.
        done, _ = await asyncio.wait([claimer[0]], timeout=30)
        if not done:
            errors.append(AssertionError("the claim waited for the erasure"))

    conn = await db.aconnect()
    async with conn:
        paused = _PauseAfter(conn, db.outbox.queries["erase_actions"], claim_meanwhile)
        try:
            report = await erase_subject(paused, "person-7", outbox=db.outbox)
            await conn.commit()
        except BaseException as exc:
            errors.append(exc)
        await claimer[0]
    assert errors == []
    assert report.actions == 1
    # The claim skipped the lane that the erasure held; the lane then moves on.
    assert [row[1] for row in claimed if row[0] != "visited"] == []
    await db.adrain()
    assert [c["id"] for c in ScriptedAdapter.calls] == [behind]
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE id = %s", (erased,)) == 0


async def test_an_erasure_beside_an_attempt_that_enqueues_into_its_lane_does_not_deadlock(
    db: OutboxTestDatabase,
) -> None:
    """A running attempt's transaction holds its action's row and enqueues a follow-up into
    the same lane. An erasure that held the lane while it waited for that row met the enqueue
    waiting for the lane. It now lets the lane go while the row is busy, and tries again."""
    holding, go_on = asyncio.Event(), asyncio.Event()

    async def run(attempt: ActionAttempt) -> AdapterResult:
        async with attempt.transaction() as conn:
            holding.set()
            await go_on.wait()
            await db.outbox.aenqueue(conn, ActionRequest("TEST_NOOP", "lane", "follow-up"))
        return Done()

    ScriptedAdapter.script = run
    erased = enqueue(db, "erased", subject_account_id="person-3")
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        attempts = executor.attempts.dispatch(rows)
        await asyncio.wait_for(holding.wait(), 10)

        async def erase() -> Any:
            conn = await db.aconnect()
            async with conn:
                report = await erase_subject(conn, "person-3", outbox=db.outbox)
                await conn.commit()
                return report

        erasure = asyncio.create_task(erase())
        await asyncio.sleep(0.3)  # the erasure finds the row busy and keeps trying
        go_on.set()
        report, *_ = await asyncio.wait_for(asyncio.gather(erasure, *attempts), 20)
    assert report.actions == 1
    assert db.rows("SELECT idempotency_key FROM {schema}.agent_action ORDER BY id") == [
        ("follow-up",)
    ]
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE id = %s", (erased,)) == 0


async def test_a_cancel_waits_for_a_busy_action_without_holding_its_lane_and_then_gives_up(
    db: OutboxTestDatabase,
) -> None:
    ScriptedAdapter.script = done
    action_id = enqueue(db, "busy")
    with db.connect() as holder:
        holder.execute(
            f'SELECT 1 FROM "{db.schema}".agent_action WHERE id = %s FOR SHARE',
            (action_id,),
        )
        conn = await db.aconnect()
        async with conn:
            with pytest.raises(LocksBusy, match=f"cancel of action {action_id}"):
                await db.outbox.acancel(conn, action_id, lock_wait_seconds=0.3)
            # Nothing was changed, and the lane was let go: the holder can enqueue into it.
            holder.execute("SET lock_timeout = '2s'")
            db.outbox.enqueue(holder, ActionRequest("TEST_NOOP", "lane", "behind"))
            await conn.rollback()
            cancelling = asyncio.create_task(db.outbox.acancel(conn, action_id))
            await asyncio.sleep(0.2)
            holder.commit()
            cancelled = await asyncio.wait_for(cancelling, 10)
            await conn.commit()
    assert cancelled is not None and cancelled.id == action_id
    assert db.rows("SELECT idempotency_key, state FROM {schema}.agent_action ORDER BY id") == [
        ("busy", "CANCELLED"),
        ("behind", "ADMITTED"),
    ]


async def test_two_run_nows_of_one_action_both_return(db: OutboxTestDatabase) -> None:
    release = asyncio.Event()

    async def slow(attempt: ActionAttempt) -> AdapterResult:
        await release.wait()
        return Done()

    ScriptedAdapter.script = slow
    action_id = enqueue(db, "once")
    async with db.executor() as executor:
        first = asyncio.create_task(executor.run_now(action_id))
        await await_for(lambda: asyncio.sleep(0, ScriptedAdapter.calls), 30, "the first run_now")
        assert await asyncio.wait_for(executor.run_now(action_id), 30) is None  # it is busy
        release.set()
        action = await asyncio.wait_for(first, 30)
    assert action is not None and str(action.state) == "DONE"


async def test_a_person_data_catalog_gets_the_erasures_outbox_from_erasing_outbox(
    db: OutboxTestDatabase,
) -> None:
    from dataclasses import replace

    from outbox_core.erasure import erasing_outbox

    seen: list[Any] = []

    class Catalog:
        name = "seen"

        async def erase(self, conn: Any, subject_account_id: str) -> int:
            seen.append(erasing_outbox())
            return 0

    outbox = db.outbox
    outbox._host = replace(outbox.host, person_data=[Catalog()])
    conn = await db.aconnect()
    async with conn:
        await erase_subject(conn, "person-1", outbox=outbox)
    assert seen == [outbox]
