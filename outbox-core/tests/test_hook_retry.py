"""An ending whose ``ended`` hook raised (a domain row another transaction held for a moment,
under the hook's short lock_timeout) is written again after a pause, in the same run: it does
not wait for the action's lease. The batch it came in is written without it meanwhile."""

from __future__ import annotations

from typing import Any, ClassVar

from outbox_core import ActionAttempt, ActionRequest, ActionVariants, AdapterResult, Done
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
