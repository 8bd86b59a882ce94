"""Every row of the specification's table "What an adapter returns", through the live executor."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Cancelled,
    Defer,
    Done,
    Failed,
    Reread,
    Retry,
    StopReason,
    Uncertain,
)
from outbox_core.testing import OutboxTestDatabase

from .kinds import AtMostOnceAdapter, ScriptedAdapter


def enqueue(
    db: OutboxTestDatabase,
    kind: str = "TEST_SCRIPTED",
    key: str = "k",
    max_attempts: int = 3,
    lane: str = "lane",
) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(
            conn, ActionRequest(kind, lane, key, max_attempts=max_attempts)
        ).id
        conn.commit()
    return action_id


def row(db: OutboxTestDatabase, action_id: int) -> dict[str, Any]:
    with db.connect() as conn:
        cursor = conn.execute(
            f"SELECT state, stop_reason, attempt, epoch, readback_ref, write_started_at IS NOT NULL AS fenced, "
            f"payload IS NULL AS no_payload, due_at > now() AS waits, lease_until > now() AS leased, last_result "
            f'FROM "{db.schema}".agent_action WHERE id = %s',
            (action_id,),
        )
        names = [c.name for c in cursor.description or []]
        values = cursor.fetchone()
    assert values is not None
    return dict(zip(names, values, strict=True))


def script(
    result: AdapterResult, *, fence: bool = False, raise_: bool = False, only_first: bool = False
):  # type: ignore[no-untyped-def]
    async def run(attempt: ActionAttempt) -> AdapterResult:
        if only_first and attempt.number > 1:
            return Done("second")
        if fence:
            assert await attempt.fence().begin_write()
        if raise_:
            raise RuntimeError("provider blew up")
        return result

    return run


LATER = timedelta(minutes=10)

# (name, kind, script, max_attempts, expected row subset, ended hook called)
TABLE = [
    (
        "done",
        "TEST_SCRIPTED",
        script(Done("provider-ref-1"), fence=True),
        3,
        {
            "state": "DONE",
            "stop_reason": StopReason.COMPLETED,
            "readback_ref": "provider-ref-1",
            "attempt": 1,
            "no_payload": True,
        },
        True,
    ),
    (
        "retry",
        "TEST_SCRIPTED",
        script(Retry(LATER), fence=True),
        3,
        {"state": "ADMITTED", "attempt": 1, "fenced": False, "waits": True, "last_result": "Retry"},
        False,
    ),
    (
        "retry-at-last-attempt",
        "TEST_SCRIPTED",
        script(Retry(LATER)),
        1,
        {"state": "FAILED", "stop_reason": StopReason.ATTEMPTS_EXHAUSTED, "attempt": 1},
        True,
    ),
    (
        "defer-does-not-count",
        "TEST_SCRIPTED",
        script(Defer(LATER)),
        1,
        {"state": "ADMITTED", "attempt": 0, "waits": True, "last_result": "Defer"},
        False,
    ),
    (
        "reread-keeps-executing-with-its-fence",
        "TEST_SCRIPTED",
        script(Reread(LATER), fence=True),
        3,
        {
            "state": "EXECUTING",
            "attempt": 1,
            "fenced": True,
            "leased": True,
            "last_result": "Reread",
        },
        False,
    ),
    (
        "reread-at-last-attempt",
        "TEST_SCRIPTED",
        script(Reread(LATER), fence=True),
        1,
        {"state": "UNCERTAIN", "stop_reason": StopReason.ATTEMPTS_EXHAUSTED},
        True,
    ),
    (
        "reread-of-at-most-once-kind",
        "TEST_ONCE",
        script(Reread(LATER), fence=True),
        3,
        {"state": "UNCERTAIN", "stop_reason": StopReason.WRITE_UNCONFIRMED},
        True,
    ),
    (
        "uncertain",
        "TEST_SCRIPTED",
        script(Uncertain("MAYBE"), fence=True),
        3,
        {"state": "UNCERTAIN", "stop_reason": "MAYBE", "no_payload": True},
        True,
    ),
    (
        "failed",
        "TEST_SCRIPTED",
        script(Failed("REFUSED")),
        3,
        {"state": "FAILED", "stop_reason": "REFUSED"},
        True,
    ),
    (
        "cancelled",
        "TEST_SCRIPTED",
        script(Cancelled("NOBODY_WANTS_IT")),
        3,
        {"state": "CANCELLED", "stop_reason": "NOBODY_WANTS_IT"},
        True,
    ),
    (
        "abandoned-changes-nothing",
        "TEST_SCRIPTED",
        script(Abandoned()),
        3,
        {"state": "EXECUTING", "attempt": 1, "epoch": 1, "last_result": None},
        False,
    ),
    (
        "exception-before-the-fence-is-a-retry",
        "TEST_SCRIPTED",
        script(Done(), raise_=True),
        3,
        {"state": "ADMITTED", "attempt": 1, "fenced": False, "last_result": "Retry"},
        False,
    ),
    (
        "exception-after-the-fence-is-a-reread",
        "TEST_SCRIPTED",
        script(Done(), fence=True, raise_=True),
        3,
        {"state": "EXECUTING", "fenced": True, "last_result": "Reread"},
        False,
    ),
    (
        "exception-after-the-fence-of-at-most-once-is-uncertain",
        "TEST_ONCE",
        script(Done(), fence=True, raise_=True),
        3,
        {"state": "UNCERTAIN", "stop_reason": StopReason.WRITE_UNCONFIRMED},
        True,
    ),
    (
        "exception-before-the-fence-at-the-last-attempt-fails",
        "TEST_SCRIPTED",
        script(Done(), raise_=True),
        1,
        {"state": "FAILED", "stop_reason": StopReason.ATTEMPTS_EXHAUSTED},
        True,
    ),
]


@pytest.mark.parametrize(
    ("name", "kind", "run", "max_attempts", "expected", "ended"), TABLE, ids=[t[0] for t in TABLE]
)
async def test_each_result_moves_the_action_as_the_table_says(
    db: OutboxTestDatabase,
    name: str,
    kind: str,
    run: Any,
    max_attempts: int,
    expected: dict[str, Any],
    ended: bool,
) -> None:
    adapter = AtMostOnceAdapter if kind == "TEST_ONCE" else ScriptedAdapter
    adapter.script = run
    action_id = enqueue(db, kind, max_attempts=max_attempts)
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        assert [r[1] for r in rows] == [action_id]
        await asyncio.gather(*executor.attempts.dispatch(rows))
    got = row(db, action_id)
    assert {key: got[key] for key in expected} == expected
    assert [e[0] for e in adapter.endings] == ([action_id] if ended else [])
    if ended:
        assert adapter.endings[0][1:] == (expected["state"], expected["stop_reason"])


async def test_the_attempt_after_a_reread_reads_back_first(db: OutboxTestDatabase) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            return Done("found-by-marker")
        assert await attempt.fence().begin_write()
        return Reread(timedelta(minutes=5))

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await db.adrain()
    assert row(db, action_id)["state"] == "EXECUTING"
    await db.adrain()  # drain makes the reread's wait run out now
    assert row(db, action_id)["state"] == "DONE"
    assert [(c["attempt"], c["epoch"], c["write_started"]) for c in ScriptedAdapter.calls] == [
        (1, 1, False),
        (2, 2, True),
    ]


async def test_an_exception_while_reading_back_an_earlier_write_keeps_the_fence(
    db: OutboxTestDatabase,
) -> None:
    """The fence is the action's: an attempt that inherits an earlier write and raises before
    its own fence (its read-back call failed) is after the fence. As a Retry it cleared the
    fence, and the next attempt skipped the read-back and wrote the effect again."""
    writes: list[int] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            if attempt.number == 2:
                raise ConnectionError("the read-back call failed")
            return Done("found-by-marker")
        assert await attempt.fence().begin_write()
        writes.append(attempt.number)
        return Reread(timedelta(minutes=5)) if attempt.number == 1 else Done("second-write")

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=5)
    await db.adrain()
    await db.adrain()
    after_raise = row(db, action_id)
    assert (after_raise["state"], after_raise["fenced"], after_raise["last_result"]) == (
        "EXECUTING",
        True,
        "Reread",
    )
    await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["readback_ref"]) == ("DONE", "found-by-marker")
    assert writes == [1]
    assert [c["write_started"] for c in ScriptedAdapter.calls] == [False, True, True]


async def test_an_exception_while_reading_back_at_the_last_attempt_ends_uncertain(
    db: OutboxTestDatabase,
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            raise ConnectionError("the read-back call failed")
        assert await attempt.fence().begin_write()
        return Reread(timedelta(minutes=5))

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=2)
    await db.adrain()
    await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["stop_reason"]) == ("UNCERTAIN", StopReason.ATTEMPTS_EXHAUSTED)
    assert [e[1:] for e in ScriptedAdapter.endings] == [
        ("UNCERTAIN", StopReason.ATTEMPTS_EXHAUSTED)
    ]


async def test_a_retry_clears_the_fence_and_the_next_attempt_sees_no_earlier_write(
    db: OutboxTestDatabase,
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        assert await attempt.fence().begin_write()
        return Retry(timedelta(minutes=5)) if attempt.number == 1 else Done()

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await db.adrain()
    await db.adrain()
    assert row(db, action_id)["state"] == "DONE"
    assert [c["write_started"] for c in ScriptedAdapter.calls] == [False, False]


async def test_a_defer_never_spends_an_attempt(db: OutboxTestDatabase) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        return Defer(timedelta(minutes=1)) if len(ScriptedAdapter.calls) <= 3 else Done()

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=1)
    for _ in range(4):
        await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["attempt"]) == ("DONE", 1)
    assert [c["attempt"] for c in ScriptedAdapter.calls] == [1, 1, 1, 1]


async def test_retry_waits_back_off_exponentially_with_jitter(db: OutboxTestDatabase) -> None:
    from outbox_core.executor.outcomes import backoff

    waits = [
        backoff(n, timedelta(seconds=4), timedelta(seconds=60)).total_seconds()
        for n in (1, 2, 3, 4, 5, 6)
    ]
    assert 2 <= waits[0] <= 4 and 2 <= waits[1] <= 8 and 2 <= waits[2] <= 16
    assert all(w <= 60 for w in waits)
    assert (
        len(
            {
                round(backoff(3, timedelta(seconds=4), timedelta(seconds=60)).total_seconds(), 6)
                for _ in range(20)
            }
        )
        > 1
    )
