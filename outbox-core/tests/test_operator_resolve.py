"""`outbox resolve` as functions: an UNCERTAIN action resolved done, not done, or read back
again, each audited and with its kind's ``ended`` hook; every refusal changes nothing; an
executor's ending and an operator's resolution of one action: exactly one wins."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import psycopg
import pytest

from outbox_core import ActionAttempt, ActionVariants, AdapterResult, Done
from outbox_core.erasure import erase_subject
from outbox_core.operator import OperatorRefused, resolve_absent, resolve_done, resolve_retry
from outbox_core.operator_changes import Resolution, change_many
from outbox_core.testing import OutboxTestDatabase

from .kinds import AtMostOnceAdapter, ScriptedAdapter, Step
from .operator_support import (
    audits,
    ended_by_executor,
    failed_before_writing,
    fence_then_uncertain,
    row,
)
from .test_concurrency import await_for, blocked_on_lock


async def test_resolve_done_ends_an_uncertain_action_done_with_the_ref_audited_and_ended_hook(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "u1")
    assert row(db, action_id)[0] == "UNCERTAIN"
    async with await db.aconnect() as conn:
        action = await resolve_done(conn, db.outbox, action_id, "msg-42", "found it", "ana")
    assert (action.state, action.stop_reason, action.readback_ref) == (
        "DONE",
        "RESOLVED_DONE",
        "msg-42",
    )
    assert row(db, action_id) == ("DONE", "RESOLVED_DONE", "msg-42", None)
    assert audits(db, action_id) == [
        ("ana", "resolve_done", "found it", "api", "UNCERTAIN", "DONE", None, "msg-42")
    ]
    assert ScriptedAdapter.endings[-1] == (action_id, "DONE", "RESOLVED_DONE")


async def test_resolve_absent_ends_it_failed_resolved_absent_with_the_ended_hook(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "u2")
    async with await db.aconnect() as conn:
        await resolve_absent(conn, db.outbox, action_id, "not in the channel", surface="cli")
        role = (await (await conn.execute("SELECT session_user")).fetchone() or [None])[0]
    assert row(db, action_id)[:2] == ("FAILED", "RESOLVED_ABSENT")
    assert audits(db, action_id) == [
        (role, "resolve_absent", "not in the channel", "cli", "UNCERTAIN", "FAILED", None, None)
    ]
    assert ScriptedAdapter.endings[-1] == (action_id, "FAILED", "RESOLVED_ABSENT")


async def test_resolve_of_an_action_that_is_not_uncertain_is_refused_and_changes_nothing(
    db: OutboxTestDatabase,
) -> None:
    failed = await ended_by_executor(db, failed_before_writing, "f1")
    async with await db.aconnect() as conn:
        with pytest.raises(OperatorRefused, match=r"is FAILED: only an UNCERTAIN action .*retry"):
            await resolve_done(conn, db.outbox, failed, "ref", "why", "ana")
        with pytest.raises(OperatorRefused, match="no action 999999"):
            await resolve_absent(conn, db.outbox, 999999, "why")
    assert row(db, failed)[:2] == ("FAILED", "REFUSED")
    assert audits(db, failed) == []


async def test_resolve_retry_reads_back_again_with_the_fence_mark_and_the_kept_payload(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "r1", payload={"n": 7})
    async with await db.aconnect() as conn:
        action = await resolve_retry(conn, db.outbox, action_id, "read it again", "ana")
    assert action.state == "ADMITTED" and action.payload == {"n": 7}
    assert action.write_started_at is not None and action.ended_at is None
    assert audits(db, action_id)[-1][1:6] == (
        "resolve_retry",
        "read it again",
        "api",
        "UNCERTAIN",
        "ADMITTED",
    )

    async def read_back(attempt: ActionAttempt) -> AdapterResult:
        # The attempt knows an earlier write may exist: it reads back, never writes blind.
        assert attempt.write_started
        return Done("found-by-marker")

    ScriptedAdapter.script = read_back
    await db.adrain()
    assert ScriptedAdapter.calls[-1]["write_started"] is True
    assert row(db, action_id)[:3] == ("DONE", "COMPLETED", "found-by-marker")


async def test_resolve_retry_is_refused_for_an_at_most_once_kind_and_an_unstarted_write(
    db: OutboxTestDatabase,
) -> None:
    once = await ended_by_executor(db, fence_then_uncertain, "o1", kind="TEST_ONCE")

    async def uncertain_unfenced(attempt: ActionAttempt) -> AdapterResult:
        from outbox_core import Uncertain

        return Uncertain()

    unfenced = await ended_by_executor(db, uncertain_unfenced, "o2")
    async with await db.aconnect() as conn:
        with pytest.raises(OperatorRefused, match="at-most-once kind, which cannot be read back"):
            await resolve_retry(conn, db.outbox, once, "why")
        with pytest.raises(OperatorRefused, match="its write never started"):
            await resolve_retry(conn, db.outbox, unfenced, "why")
    assert row(db, once)[0] == row(db, unfenced)[0] == "UNCERTAIN"
    assert audits(db, once) == audits(db, unfenced) == []
    assert AtMostOnceAdapter.endings[-1][1] == "UNCERTAIN"


async def test_many_at_once_a_dry_run_or_one_refusal_writes_nothing(
    db: OutboxTestDatabase,
) -> None:
    first = await ended_by_executor(db, fence_then_uncertain, "m1")
    second = await ended_by_executor(db, fence_then_uncertain, "m2")
    failed = await ended_by_executor(db, failed_before_writing, "m3")
    async with await db.aconnect() as conn:
        plan = await change_many(
            conn, db.outbox, [second, first], Resolution.ABSENT, "why", dry_run=True
        )
        assert [(c.action_id, c.before, c.after) for c in plan.changes] == [
            (first, "UNCERTAIN", "FAILED"),
            (second, "UNCERTAIN", "FAILED"),
        ]
        assert not plan.written and plan.refusals == []
        refused = await change_many(conn, db.outbox, [first, failed], Resolution.ABSENT, "why")
        assert [r.action_id for r in refused.refusals] == [failed] and not refused.written
        assert row(db, first)[0] == row(db, second)[0] == "UNCERTAIN"
        done = await change_many(conn, db.outbox, [first, second], Resolution.ABSENT, "why")
    assert done.written and [row(db, i)[0] for i in (first, second)] == ["FAILED", "FAILED"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"ids": [], "reason": "why"}, "ids"),
        ({"ids": [0], "reason": "why"}, "ids"),
        ({"ids": [1], "reason": "  "}, "reason"),
        ({"ids": [1], "reason": "why", "by": ""}, "by"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    db: OutboxTestDatabase, args: dict[str, Any], field: str
) -> None:
    from outbox_core import InvalidRequest

    async with await db.aconnect() as conn:
        with pytest.raises(InvalidRequest, match=f"^{field}: "):
            await change_many(conn, db.outbox, how=Resolution.ABSENT, **args)


async def test_resolve_done_needs_a_ref(db: OutboxTestDatabase) -> None:
    from outbox_core import InvalidRequest

    action_id = await ended_by_executor(db, fence_then_uncertain, "ref")
    async with await db.aconnect() as conn:
        with pytest.raises(InvalidRequest, match="^ref: "):
            await resolve_done(conn, db.outbox, action_id, " ", "why")
    assert row(db, action_id)[0] == "UNCERTAIN"


def test_an_audit_row_of_another_change_does_not_let_a_resolution_through(
    db: OutboxTestDatabase,
) -> None:
    action_id = asyncio.run(ended_by_executor(db, fence_then_uncertain, "other"))
    with db.connect() as conn:
        conn.execute(
            f'INSERT INTO "{db.schema}".action_audit (action_id, actor, command, reason, surface, '
            "before_state, after_state) VALUES (%s, 't', 'resolve_done', 'x', 'api', "
            "'UNCERTAIN', 'DONE')",
            (action_id,),
        )
        change = (
            f"UPDATE \"{db.schema}\".agent_action SET state = 'FAILED', "
            "stop_reason = 'RESOLVED_ABSENT' WHERE id = %s"
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="never changes"):
            conn.execute(change, (action_id,))


class GatedEndingAdapter(ScriptedAdapter):
    """Its ``ended`` waits for the test's gate, holding the ending's transaction open."""

    kind = "TEST_GATED_END"
    entered: ClassVar[asyncio.Event]
    gate: ClassVar[asyncio.Event]

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def ended(self, conn: Any, action: Any) -> None:
        type(self).entered.set()
        await type(self).gate.wait()
        await super().ended(conn, action)


async def test_an_executor_ending_the_action_while_the_operator_resolves_it_wins_alone(
    db: OutboxTestDatabase,
) -> None:
    db.register_kind(GatedEndingAdapter)
    GatedEndingAdapter.entered, GatedEndingAdapter.gate = asyncio.Event(), asyncio.Event()
    GatedEndingAdapter.endings = []

    async def done(attempt: ActionAttempt) -> AdapterResult:
        return Done("exec-ref")

    running = asyncio.create_task(ended_by_executor(db, done, "race", kind="TEST_GATED_END"))
    await asyncio.wait_for(GatedEndingAdapter.entered.wait(), 30)
    action_id = db.scalar("SELECT id FROM {schema}.agent_action WHERE idempotency_key = 'race'")
    async with await db.aconnect() as conn:
        resolving = asyncio.create_task(
            resolve_done(conn, db.outbox, action_id, "op-ref", "operator", "ana")
        )
        await await_for(
            lambda: blocked_on_lock(db, conn.info.backend_pid), 15, "the operator to wait"
        )
        GatedEndingAdapter.gate.set()
        await running
        with pytest.raises(OperatorRefused, match="is DONE: only an UNCERTAIN action"):
            await resolving
    assert row(db, action_id)[:3] == ("DONE", "COMPLETED", "exec-ref")
    assert audits(db, action_id) == []
    assert GatedEndingAdapter.endings == [(action_id, "DONE", "COMPLETED")]


async def test_two_operators_resolving_one_action_at_once_exactly_one_wins(
    db: OutboxTestDatabase,
) -> None:
    action_id = await ended_by_executor(db, fence_then_uncertain, "two")
    async with await db.aconnect() as one, await db.aconnect() as other:
        answers = await asyncio.gather(
            resolve_done(one, db.outbox, action_id, "ref", "found", "ana"),
            resolve_absent(other, db.outbox, action_id, "absent", "bo"),
            return_exceptions=True,
        )
    refused = [a for a in answers if isinstance(a, OperatorRefused)]
    assert len(refused) == 1 and "only an UNCERTAIN action" in str(refused[0])
    assert len(audits(db, action_id)) == 1
    assert row(db, action_id)[0] in ("DONE", "FAILED")


async def test_the_audit_and_the_kept_payload_go_with_the_action_on_erasure_and_retention(
    db: OutboxTestDatabase,
) -> None:
    erased = await ended_by_executor(db, fence_then_uncertain, "e1", subject="acct-9")
    kept = await ended_by_executor(db, fence_then_uncertain, "e2")
    async with await db.aconnect() as conn:
        await resolve_absent(conn, db.outbox, erased, "gone", "ana")
        await resolve_absent(conn, db.outbox, kept, "gone", "ana")
    count = (
        "SELECT (SELECT count(*) FROM {schema}.action_audit WHERE action_id = %(id)s) "
        "+ (SELECT count(*) FROM {schema}.action_kept_payload WHERE action_id = %(id)s)"
    )
    assert db.scalar(count, {"id": erased}) == db.scalar(count, {"id": kept}) == 2
    async with await db.aconnect() as conn:
        await erase_subject(conn, "acct-9", outbox=db.outbox)
        await conn.commit()
    assert db.scalar(count, {"id": erased}) == 0
    assert db.scalar(count, {"id": kept}) == 2
    with db.connect() as conn:
        conn.execute(
            db.outbox.queries["retention_delete"],
            {"keep": -60, "kind": "TEST_SCRIPTED", "after": 0, "limit": 1000},
        )
        conn.commit()
    assert db.scalar(count, {"id": kept}) == 0


class RefusesResolutionsAdapter(ScriptedAdapter):
    """Its ``ended`` refuses a reference that is not in its form (as an issue's URL is)."""

    kind = "TEST_REFS"

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def ended(self, conn: Any, action: Any) -> None:
        if action.readback_ref is not None and not action.readback_ref.startswith("https://"):
            raise ValueError(f"{action.readback_ref!r} is not a URL")


async def test_a_resolution_that_the_kinds_ended_hook_refuses_changes_nothing(
    db: OutboxTestDatabase,
) -> None:
    db.register_kind(RefusesResolutionsAdapter)
    action_id = await ended_by_executor(db, fence_then_uncertain, "refs", kind="TEST_REFS")
    async with await db.aconnect() as conn:
        with pytest.raises(OperatorRefused, match="ended hook refused the resolution"):
            await resolve_done(conn, db.outbox, action_id, "42", "found", "ana")
        await resolve_done(conn, db.outbox, action_id, "https://x/42", "found", "ana")
    assert row(db, action_id)[:3] == ("DONE", "RESOLVED_DONE", "https://x/42")
    assert len(audits(db, action_id)) == 1
