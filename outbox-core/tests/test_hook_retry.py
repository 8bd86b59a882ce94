"""An ending whose ``ended`` hook raised (a domain row another transaction held for a moment,
under the hook's short lock_timeout) is written again after a pause, in the same run: it does
not wait for the action's lease. The batch it came in is written without it meanwhile."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
import pytest

from outbox_core import (
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    Done,
    StopReason,
)
from outbox_core.executor.attempts import claimed_action
from outbox_core.executor.endings import Endings
from outbox_core.executor.outcomes import Ending
from outbox_core.states import ActionState
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter, Step


class BusyHookAdapter(ScriptedAdapter):
    """Its ``ended`` raises the first ``failures`` times (as a lock_timeout would)."""

    kind = "TEST_BUSY_HOOK"
    failures: ClassVar[int] = 0
    tries: ClassVar[int] = 0

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done("ok")

    async def ended(self, conn: Any, action: Any) -> None:
        type(self).tries += 1
        if type(self).tries <= type(self).failures:
            raise RuntimeError("canceling statement due to lock timeout")
        await super().ended(conn, action)


def enqueue(db: OutboxTestDatabase, kind: str, key: str) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest(kind, f"lane-{key}", key)).id
        conn.commit()
    return action_id


def state(db: OutboxTestDatabase, action_id: int) -> str:
    return str(db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (action_id,)))


async def done(attempt: ActionAttempt) -> AdapterResult:
    return Done()


def test_an_ending_whose_hook_failed_twice_is_written_on_the_third_try_in_the_same_run(
    db: OutboxTestDatabase,
) -> None:
    db.register_kind(BusyHookAdapter)
    BusyHookAdapter.failures, BusyHookAdapter.tries, BusyHookAdapter.endings = 2, 0, []
    ScriptedAdapter.script = done
    busy = enqueue(db, "TEST_BUSY_HOOK", "busy")
    other = enqueue(db, "TEST_SCRIPTED", "other")

    db.drain()

    assert state(db, busy) == "DONE"
    assert state(db, other) == "DONE"
    assert BusyHookAdapter.tries == 3
    assert BusyHookAdapter.endings == [(busy, "DONE", "COMPLETED")]


def test_a_hook_that_keeps_failing_is_given_up_on_and_its_action_waits_for_its_lease(
    db: OutboxTestDatabase,
) -> None:
    db.register_kind(BusyHookAdapter)
    BusyHookAdapter.failures, BusyHookAdapter.tries, BusyHookAdapter.endings = 100, 0, []
    busy = enqueue(db, "TEST_BUSY_HOOK", "busy")

    db.drain()

    assert state(db, busy) == "EXECUTING"
    assert BusyHookAdapter.tries == 7  # the first write and six more, then the lease decides
    assert BusyHookAdapter.endings == []


async def test_run_now_waits_for_the_ending_written_again_after_its_hook_failed(
    db: OutboxTestDatabase,
) -> None:
    """run_now returned once the first write of the ending was answered: with the hook's
    failure the action was still EXECUTING, and the executor of `outbox run-now` then closed,
    cancelling the retry, so the action waited for its lease."""
    db.register_kind(BusyHookAdapter)
    BusyHookAdapter.failures, BusyHookAdapter.tries, BusyHookAdapter.endings = 1, 0, []
    busy = enqueue(db, "TEST_BUSY_HOOK", "busy")

    async with db.executor() as executor:
        action = await executor.run_now(busy)

    assert action is not None and str(action.state) == "DONE"
    assert state(db, busy) == "DONE"
    assert BusyHookAdapter.tries == 2
    assert BusyHookAdapter.endings == [(busy, "DONE", "COMPLETED")]


async def test_a_write_that_fails_after_the_others_of_its_batch_were_written_one_by_one_does_not_report_or_chain_them_again(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose hook raised is written one ending at a time; a dropped connection on a
    later one made the whole batch be written again, and the lost-reply recognition then took
    the endings written one by one for ones the lost reply had written: each reported a second
    time, and the next heads their writes had claimed started a second time (two attempts of
    one action at one epoch)."""
    db.register_kind(BusyHookAdapter)
    BusyHookAdapter.failures, BusyHookAdapter.tries, BusyHookAdapter.endings = 1, 0, []
    first = enqueue(db, "TEST_BUSY_HOOK", "first")
    with db.connect() as conn:
        behind = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane-first", "behind")).id
        conn.commit()
    second = enqueue(db, "TEST_NOOP", "second")
    chained: list[int] = []
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        claimed = {row[1]: claimed_action(row) for row in rows}
        assert sorted(claimed) == [first, second]
        endings = [
            Ending(
                c.id,
                c.kind,
                c.lane_key,
                c.epoch,
                ActionState.EXECUTING,
                ActionState.DONE,
                "Done",
                StopReason.COMPLETED,
            )
            for c in (claimed[first], claimed[second])
        ]
        executor.rt.chaining = True
        executor.endings._chained = lambda rows: chained.extend(row[1] for row in rows)
        write = Endings._write
        calls: list[list[int]] = []

        async def flaky(self: Endings, batch: Sequence[Ending]) -> list[bool]:
            calls.append([e.action_id for e in batch])
            if len(calls) == 3:  # the second ending alone, after the first was written
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return await write(self, batch)

        monkeypatch.setattr(Endings, "_write", flaky)
        caplog.set_level(logging.INFO, logger="outbox")
        answers = await executor.endings._flush(endings)

    assert answers == [True, True]
    assert state(db, first) == "DONE" and state(db, second) == "DONE"
    assert chained == [behind]
    done = [r for r in caplog.records if r.getMessage().startswith("action.ended.done")]
    assert sorted(r.getMessage().split("action.id=")[1].split()[0] for r in done) == sorted(
        [str(first), str(second)]
    )
