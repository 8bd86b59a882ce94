"""Every row of the specification's table "What an adapter returns", through the live executor."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionRequest,
    AdapterContractError,
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
        "reread-before-any-write-counts-as-there-is-nothing-to-read",
        "TEST_SCRIPTED",
        script(Reread(LATER)),
        1,
        {"state": "UNCERTAIN", "stop_reason": StopReason.ATTEMPTS_EXHAUSTED, "attempt": 1},
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
        "reread-of-at-most-once-kind-before-its-fence",
        "TEST_ONCE",
        script(Reread(LATER)),
        3,
        {"state": "UNCERTAIN", "stop_reason": StopReason.WRITE_UNCONFIRMED, "attempt": 1},
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


def written_before(db: OutboxTestDatabase, action_id: int, ago: timedelta) -> None:
    """An earlier attempt's write started ``ago`` before now, on the database clock: the
    admitted action as a Defer after a Reread leaves it (waiting, its fence kept)."""
    db.execute(
        "UPDATE {schema}.agent_action SET write_started_at = now() - %s"
        " WHERE id = %s AND state = 'ADMITTED'",
        (ago, action_id),
    )


READ = Reread(detail="GET HTTP 503: not read")

# The rows of the table for an attempt that starts after an earlier write (write_started):
# (name, script, how long before the claim the write started, expected row subset, ended).
# Reads are bounded by the kind's unreadable_for (15 minutes by default), not by attempts.
TABLE_AFTER_A_WRITE = [
    (
        "reread-after-only-reading-counts-no-attempt",
        script(READ),
        timedelta(minutes=1),
        {"state": "EXECUTING", "attempt": 0, "fenced": True, "leased": True},
        False,
    ),
    (
        "reread-after-only-reading-past-unreadable-for-is-readback-unavailable",
        script(READ),
        timedelta(minutes=16),
        {"state": "UNCERTAIN", "stop_reason": StopReason.READBACK_UNAVAILABLE, "attempt": 1},
        True,
    ),
    (
        "exception-while-only-reading-counts-no-attempt",
        script(Done(), raise_=True),
        timedelta(minutes=1),
        {"state": "EXECUTING", "attempt": 0, "fenced": True, "last_result": "Reread"},
        False,
    ),
    (
        "reread-after-writing-again-at-the-last-attempt",
        script(READ, fence=True),
        timedelta(minutes=1),
        {"state": "UNCERTAIN", "stop_reason": StopReason.ATTEMPTS_EXHAUSTED, "attempt": 1},
        True,
    ),
]


@pytest.mark.parametrize(
    ("name", "run", "ago", "expected", "ended"),
    TABLE_AFTER_A_WRITE,
    ids=[t[0] for t in TABLE_AFTER_A_WRITE],
)
async def test_each_result_after_an_earlier_write_moves_the_action_as_the_table_says(
    db: OutboxTestDatabase,
    name: str,
    run: Any,
    ago: timedelta,
    expected: dict[str, Any],
    ended: bool,
) -> None:
    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=1)
    written_before(db, action_id, ago)
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        assert [r[1] for r in rows] == [action_id]
        await asyncio.gather(*executor.attempts.dispatch(rows))
        await executor.settle()
    got = row(db, action_id)
    assert {key: got[key] for key in expected} == expected
    assert [e[0] for e in ScriptedAdapter.endings] == ([action_id] if ended else [])


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
            if len(ScriptedAdapter.calls) == 2:
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


async def test_an_exception_while_reading_back_at_the_last_attempt_spends_no_attempt(
    db: OutboxTestDatabase,
) -> None:
    """It ended the action UNCERTAIN ATTEMPTS_EXHAUSTED: a read-back outage spent the attempts.
    An attempt that only read is bounded by the kind's read window instead."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.write_started:
            raise ConnectionError("the read-back call failed")
        assert await attempt.fence().begin_write()
        return Reread(timedelta(minutes=5))

    ScriptedAdapter.script = run
    action_id = enqueue(db, max_attempts=2)
    for _ in range(4):
        await db.adrain()
    got = row(db, action_id)
    assert (got["state"], got["attempt"], got["last_result"]) == ("EXECUTING", 1, "Reread")
    assert [c["attempt"] for c in ScriptedAdapter.calls] == [1, 2, 2, 2]
    assert ScriptedAdapter.endings == []


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


def returning(value: Any, *, fence: bool = False):  # type: ignore[no-untyped-def]
    async def run(attempt: ActionAttempt) -> Any:
        if fence:
            assert await attempt.fence().begin_write()
        return value

    return run


# (name, kind, what execute() returns, fence first, expected row subset, what the log names)
WRONG = [
    (
        "none-before-the-fence-is-a-retry",
        "TEST_SCRIPTED",
        None,
        False,
        {"state": "ADMITTED", "attempt": 1, "fenced": False, "last_result": "Retry"},
        "NoneType",
    ),
    (
        "none-after-the-fence-is-a-reread",
        "TEST_SCRIPTED",
        None,
        True,
        {"state": "EXECUTING", "attempt": 1, "fenced": True, "last_result": "Reread"},
        "NoneType",
    ),
    (
        "none-after-the-fence-of-at-most-once-is-uncertain",
        "TEST_ONCE",
        None,
        True,
        {"state": "UNCERTAIN", "stop_reason": StopReason.WRITE_UNCONFIRMED},
        "NoneType",
    ),
    (
        "a-string-is-not-a-result",
        "TEST_SCRIPTED",
        "Done",
        False,
        {"state": "ADMITTED", "attempt": 1, "last_result": "Retry"},
        "str",
    ),
    (
        "a-readback-ref-that-is-not-text",
        "TEST_SCRIPTED",
        Done(42),  # type: ignore[arg-type]
        True,
        {"state": "EXECUTING", "readback_ref": None, "last_result": "Reread"},
        "Done",
    ),
    (
        "a-wait-that-is-not-a-timedelta",
        "TEST_SCRIPTED",
        Defer(5),  # type: ignore[arg-type]
        False,
        {"state": "ADMITTED", "attempt": 1, "last_result": "Retry"},
        "Defer",
    ),
]


@pytest.mark.parametrize(
    ("name", "kind", "value", "fence", "expected", "returned"), WRONG, ids=[w[0] for w in WRONG]
)
async def test_a_result_that_is_not_an_adapter_result_ends_the_attempt_as_an_exception_would(
    db: OutboxTestDatabase,
    caplog: pytest.LogCaptureFixture,
    name: str,
    kind: str,
    value: Any,
    fence: bool,
    expected: dict[str, Any],
    returned: str,
) -> None:
    """A forgotten return (or a malformed result) left the action EXECUTING for its whole
    lease with one log line. It is a bug of that attempt, ended as an exception ends one."""
    adapter = AtMostOnceAdapter if kind == "TEST_ONCE" else ScriptedAdapter
    adapter.script = returning(value, fence=fence)
    action_id = enqueue(db, kind)
    with caplog.at_level(logging.ERROR, logger="outbox"):
        async with db.executor() as executor:
            rows, _ = await executor.claims.claim(10)
            await asyncio.gather(*executor.attempts.dispatch(rows))
            await executor.settle()
    got = row(db, action_id)
    assert {key: got[key] for key in expected} == expected
    logged = [
        r for r in caplog.records if getattr(r, "event", None) == "action.attempt.wrong_result"
    ]
    assert [(getattr(r, "action.id"), getattr(r, "action.kind")) for r in logged] == [
        (action_id, kind)
    ]
    assert getattr(logged[0], "action.returned") == returned
    assert not [r for r in caplog.records if getattr(r, "event", None) == "executor.task.failed"]


async def test_drain_raises_when_an_adapter_returns_what_is_not_a_result(
    db: OutboxTestDatabase,
) -> None:
    async def forgot_to_return(attempt: ActionAttempt) -> AdapterResult:
        await attempt.fence().begin_write()  # and no `return Done(...)`
        return None  # type: ignore[return-value]

    ScriptedAdapter.script = forgot_to_return
    action_id = enqueue(db)
    with pytest.raises(
        AdapterContractError, match=r"ScriptedAdapter\.execute\(\) returned NoneType"
    ):
        await db.adrain()
    assert row(db, action_id)["last_result"] == "Reread"  # ended, as if it raised


async def test_a_malformed_result_does_not_fail_the_batch_of_endings_it_shares(
    db: OutboxTestDatabase,
) -> None:
    """Retry(after=5) broke the JSON of the batch of endings it was written in, and every
    action of that batch stayed EXECUTING until its lease ran out."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        await asyncio.sleep(0.05)  # both attempts end into one batch
        if attempt.idempotency_key == "bad":
            return Retry(after=5)  # type: ignore[arg-type]
        return Done("fine")

    ScriptedAdapter.script = run
    bad, good = enqueue(db, key="bad", lane="a"), enqueue(db, key="good", lane="b")
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        assert sorted(r[1] for r in rows) == [bad, good]
        await asyncio.gather(*executor.attempts.dispatch(rows))
        await executor.settle()
    assert row(db, good)["state"] == "DONE"
    assert (row(db, bad)["state"], row(db, bad)["last_result"]) == ("ADMITTED", "Retry")


async def test_a_deferred_attempt_knows_it_is_a_re_run(db: OutboxTestDatabase) -> None:
    """attempt.number repeats after a Defer (it does not count); attempt.run counts every
    claim, so the third run after two Defers sees run 3 and number 1."""
    seen: list[tuple[int, int]] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        seen.append((attempt.number, attempt.run))
        return Defer(timedelta(minutes=1)) if len(seen) <= 2 else Done()

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    for _ in range(3):
        await db.adrain()
    assert row(db, action_id)["state"] == "DONE"
    assert seen == [(1, 1), (1, 2), (1, 3)]
