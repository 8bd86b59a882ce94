"""Sync and async twins: every public read and write of the core has both forms, written once
as steps (outbox_core.steps) and run by a thin sync or async shell."""

from __future__ import annotations

import inspect

import psycopg
import pytest

from outbox_core import ActionRequest, Outbox
from outbox_core.steps import NeedsAsync, Query, Steps, arun, atomic, run
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter

OPERATIONS = ["enqueue", "enqueue_many", "admit", "cancel", "get", "lane", "by_keys"]


@pytest.mark.parametrize("name", OPERATIONS)
def test_every_public_read_and_write_has_a_sync_and_an_async_twin_and_its_steps(
    name: str,
) -> None:
    sync, twin, steps = (getattr(Outbox, n) for n in (name, f"a{name}", f"{name}_steps"))
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(twin)
    assert inspect.isgeneratorfunction(steps)
    # The twins take the same arguments; the steps take them without the connection.
    sync_params = list(inspect.signature(sync).parameters.values())
    twin_params = list(inspect.signature(twin).parameters.values())
    steps_params = list(inspect.signature(steps).parameters.values())
    assert [(p.name, p.kind, p.default) for p in sync_params] == [
        (p.name, p.kind, p.default) for p in twin_params
    ]
    assert [p.name for p in sync_params if p.name != "conn"] == [p.name for p in steps_params]


async def test_one_async_connection_can_enqueue_admit_cancel_and_read_a_lane(
    db: OutboxTestDatabase,
) -> None:
    conn = await db.aconnect()
    async with conn:
        first = await db.outbox.aenqueue(conn, ActionRequest("TEST_NOOP", "lane", "first"))
        proposal = await db.outbox.aenqueue(
            conn, ActionRequest("TEST_NOOP", "lane", "proposal", proposed=True)
        )
        assert await db.outbox.aadmit(conn, proposal.id)
        cancelled = await db.outbox.acancel(conn, first.id)
        assert cancelled is not None and str(cancelled.state) == "CANCELLED"
        live = await db.outbox.alane(conn, "lane")
        every = await db.outbox.alane(conn, "lane", live_only=False)
        by_key = await db.outbox.aby_keys(conn, ["first", "proposal"])
        got = await db.outbox.aget(conn, proposal.id)
        await conn.commit()
    assert [a.id for a in live] == [proposal.id]
    assert [(a.id, str(a.state)) for a in every] == [
        (first.id, "CANCELLED"),
        (proposal.id, "ADMITTED"),
    ]
    assert [a.id for a in by_key] == [first.id, proposal.id]
    assert got is not None and str(got.state) == "ADMITTED"


def test_one_sync_connection_can_cancel_and_read_a_lane(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        first = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "first"))
        second = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "second"))
        conn.commit()
        cancelled = db.outbox.cancel(conn, first.id)
        assert cancelled is not None and cancelled.stop_reason == "OPERATOR_CANCELLED"
        assert db.outbox.cancel(conn, first.id) is None  # already ended
        assert [a.id for a in db.outbox.lane(conn, "lane")] == [second.id]
        conn.commit()
    assert db.scalar("SELECT head_kind FROM {schema}.action_lane WHERE lane_key = 'lane'") is None


def test_a_sync_cancel_of_a_kind_with_an_async_ended_hook_is_refused_and_changes_nothing(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        action = db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "hooked"))
        conn.commit()
        with pytest.raises(NeedsAsync, match="await outbox.acancel"):
            db.outbox.cancel(conn, action.id)
        # Nothing changed, and the caller's transaction is still usable.
        assert [str(a.state) for a in db.outbox.by_keys(conn, ["hooked"])] == ["ADMITTED"]
        conn.commit()
    assert ScriptedAdapter.endings == []


async def test_an_async_cancel_runs_the_kinds_ended_hook_in_the_callers_transaction(
    db: OutboxTestDatabase,
) -> None:
    conn = await db.aconnect()
    async with conn:
        action = await db.outbox.aenqueue(conn, ActionRequest("TEST_SCRIPTED", "lane", "hooked"))
        await conn.commit()
        await db.outbox.acancel(conn, action.id)
        await conn.commit()
    assert ScriptedAdapter.endings == [(action.id, "CANCELLED", "OPERATOR_CANCELLED")]


async def test_a_form_given_the_other_kind_of_connection_names_its_twin(
    db: OutboxTestDatabase,
) -> None:
    aconn = await db.aconnect()
    async with aconn:
        with pytest.raises(TypeError, match="await its async twin"):
            db.outbox.cancel(aconn, 1)  # type: ignore[arg-type]
    with db.connect() as conn, pytest.raises(TypeError, match="call its sync twin"):
        await db.outbox.alane(conn, "lane")  # type: ignore[arg-type]


def _insert_then_fail(db: OutboxTestDatabase) -> Steps[None]:
    yield Query(
        f'INSERT INTO "{db.schema}".action_lane (lane_key, next_at) VALUES (%(key)s, now())',
        {"key": "undone"},
    )
    raise RuntimeError("after the write")


@pytest.mark.parametrize("autocommit", [False, True], ids=["in-transaction", "autocommit"])
async def test_atomic_steps_that_raise_are_undone_and_leave_the_callers_work(
    db: OutboxTestDatabase, autocommit: bool
) -> None:
    kept = f'INSERT INTO "{db.schema}".action_lane (lane_key, next_at) VALUES (%s, now())'
    with psycopg.connect(db.url, autocommit=autocommit) as conn:
        conn.execute(kept, ("sync-kept",))
        with pytest.raises(RuntimeError, match="after the write"):
            run(conn, atomic(_insert_then_fail(db)))
        conn.commit()
    aconn = await psycopg.AsyncConnection.connect(db.url, autocommit=autocommit)
    async with aconn:
        await aconn.execute(kept, ("async-kept",))
        with pytest.raises(RuntimeError, match="after the write"):
            await arun(aconn, atomic(_insert_then_fail(db)))
        await aconn.commit()
    assert db.rows("SELECT lane_key FROM {schema}.action_lane ORDER BY lane_key") == [
        ("async-kept",),
        ("sync-kept",),
    ]


def test_an_error_of_a_statement_is_thrown_into_the_steps_that_ran_it(
    db: OutboxTestDatabase,
) -> None:
    def steps() -> Steps[str]:
        try:
            yield Query("SELECT 1/0")
        except psycopg.errors.DivisionByZero as exc:
            return type(exc).__name__
        return "no error"

    with db.connect(autocommit=True) as conn:
        assert run(conn, steps()) == "DivisionByZero"
