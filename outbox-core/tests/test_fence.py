"""The write fence and the adapter's transaction under the lease."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import pytest

from outbox_core import Abandoned, ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.attempt import LeaseLost
from outbox_core.erasure import erase_subject
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .test_concurrency import ascalar, await_for


def enqueue(
    db: OutboxTestDatabase, key: str = "k", lane: str = "lane", subject: str | None = None
) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(
            conn, ActionRequest("TEST_SCRIPTED", lane, key, subject_account_id=subject)
        ).id
        conn.commit()
    return action_id


def state(db: OutboxTestDatabase, action_id: int) -> Any:
    return db.scalar("SELECT state FROM {schema}.agent_action WHERE id = %s", (action_id,))


async def test_begin_write_may_be_called_once_per_copy(db: OutboxTestDatabase) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        results = [await attempt.fence().begin_write() for _ in range(3)]
        return Done(",".join(map(str, results)))

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await db.adrain()
    assert (
        db.scalar("SELECT readback_ref FROM {schema}.agent_action WHERE id = %s", (action_id,))
        == "True,True,True"
    )


def shorten_lease(db: OutboxTestDatabase, action_id: int, seconds: float = 30.0) -> None:
    """Leave the attempt ``seconds`` of lease, less than the fence margin (60 s)."""
    db.execute(
        "UPDATE {schema}.agent_action SET lease_until = now() + make_interval(secs => %s) "
        "WHERE id = %s",
        (seconds, action_id),
    )


def fields(db: OutboxTestDatabase, action_id: int) -> dict[str, Any]:
    with db.connect() as conn:
        cursor = conn.execute(
            f"SELECT state, attempt, epoch, due_at <= now() AS due, lease_until, "
            f'write_started_at, last_result FROM "{db.schema}".agent_action WHERE id = %s',
            (action_id,),
        )
        names = [c.name for c in cursor.description or []]
        values = cursor.fetchone()
    assert values is not None
    return dict(zip(names, values, strict=True))


async def claim_and_run(db: OutboxTestDatabase, action_id: int) -> None:
    """One claim and its attempt, written, without drain() making anything due."""
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        assert [(r[0], r[1]) for r in rows] == [("claim", action_id)]
        await asyncio.gather(*executor.attempts.dispatch(rows))
        await executor.settle()


async def test_a_fence_refused_for_its_margin_gives_the_action_back_at_once_uncounted(
    db: OutboxTestDatabase,
) -> None:
    """Less than the margin of lease left at the fence, the epoch still the attempt's: the
    action does not wait out its lease with an attempt spent. It is ADMITTED again, due now,
    its attempt not counted, the provider got nothing, and the next claim runs it."""
    writes: list[int] = []
    seen: list[tuple[int, int, bool]] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if not seen:
            shorten_lease(db, attempt.id)
        passed = await attempt.fence().begin_write()
        seen.append((attempt.number, attempt.run, passed))
        if not passed:
            return Abandoned()
        writes.append(attempt.id)
        return Done("sent")

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await claim_and_run(db, action_id)
    got = fields(db, action_id)
    assert (got["state"], got["attempt"], got["epoch"], got["due"]) == ("ADMITTED", 0, 1, True)
    assert got["lease_until"] is None and got["write_started_at"] is None
    assert writes == []

    await claim_and_run(db, action_id)  # the next claim runs it, with a whole lease
    got = fields(db, action_id)
    assert (got["state"], got["attempt"], got["epoch"]) == ("DONE", 1, 2)
    assert writes == [action_id]
    assert seen == [(1, 1, False), (1, 2, True)]


async def test_a_fence_refused_because_another_holder_took_the_action_gives_nothing_back(
    db: OutboxTestDatabase,
) -> None:
    """The margin's give-back is for the attempt's own epoch only: when another claim took the
    action (an expired lease reclaimed), the old attempt's Abandoned changes nothing."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.epoch == 1:
            db.execute(  # another replica reclaimed it; little of its lease is left
                "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 s' "
                "WHERE id = %s",
                (attempt.id,),
            )
            db.execute(
                "UPDATE {schema}.agent_action SET epoch = epoch + 1, attempt = attempt + 1, "
                "lease_until = now() + interval '30 s' WHERE id = %s",
                (attempt.id,),
            )
        if not await attempt.fence().begin_write():
            return Abandoned()
        raise AssertionError("the provider must not be called")

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await claim_and_run(db, action_id)
    got = fields(db, action_id)
    assert (got["state"], got["attempt"], got["epoch"]) == ("EXECUTING", 2, 2)
    assert got["last_result"] is None and got["lease_until"] is not None


async def test_a_fence_refused_for_its_margin_after_a_passed_fence_is_not_given_back(
    db: OutboxTestDatabase,
) -> None:
    """An attempt whose first copy passed its fence may have written: a refusal for the margin
    at its second copy leaves the action to its lease (the next attempt reads back)."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        assert await attempt.fence().begin_write()
        shorten_lease(db, attempt.id)
        if not await attempt.fence().begin_write():
            return Abandoned()
        raise AssertionError("the second copy's fence must refuse")

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await claim_and_run(db, action_id)
    got = fields(db, action_id)
    assert (got["state"], got["attempt"], got["epoch"]) == ("EXECUTING", 1, 1)
    assert got["write_started_at"] is not None and got["last_result"] is None


async def test_a_kind_that_always_reaches_its_fence_short_of_lease_still_exhausts_its_attempts(
    db: OutboxTestDatabase,
) -> None:
    """The give-back is uncounted once per attempt number: work before the fence that always
    outlasts what the lease leaves it runs twice per attempt (the second short fence counts,
    as an exception before the write) and ends ATTEMPTS_EXHAUSTED, as it did when each attempt
    waited out its lease, instead of being given back for ever."""
    runs: list[tuple[int, int]] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        runs.append((attempt.number, attempt.run))
        shorten_lease(db, attempt.id)
        if not await attempt.fence().begin_write():
            return Abandoned()
        raise AssertionError("the provider must not be called")

    ScriptedAdapter.script = run
    with db.connect() as conn:
        action_id = db.outbox.enqueue(
            conn, ActionRequest("TEST_SCRIPTED", "lane", "k", max_attempts=2)
        ).id
        conn.commit()
    for _ in range(4):  # each drain makes the Retry's backoff run out
        await db.adrain()
    got = db.rows(
        "SELECT state, stop_reason, attempt, write_started_at FROM {schema}.agent_action "
        "WHERE id = %s",
        (action_id,),
    )
    assert got == [("FAILED", "ATTEMPTS_EXHAUSTED", 2, None)]
    assert runs == [(1, 1), (1, 2), (2, 3), (2, 4)]


async def test_the_fence_refuses_after_an_erasure_deleted_the_action(
    db: OutboxTestDatabase,
) -> None:
    from outbox_core.erasure import erase_subject

    seen: list[bool] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        conn = await db.aconnect()
        async with conn:
            await erase_subject(conn, "person-1", outbox=db.outbox)
            await conn.commit()
        seen.append(await attempt.fence().begin_write())
        return Abandoned()

    ScriptedAdapter.script = run
    enqueue(db, subject="person-1")
    await db.adrain()
    assert seen == [False]
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


async def test_the_fence_refuses_an_older_epoch_after_a_reclaim(db: OutboxTestDatabase) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        with db.connect(autocommit=True) as conn:  # another replica reclaimed it
            conn.execute(
                f"UPDATE \"{db.schema}\".agent_action SET lease_until = now() - interval '1 s' WHERE id = %s",
                (attempt.id,),
            )
            conn.execute(
                f"UPDATE \"{db.schema}\".agent_action SET epoch = epoch + 1, attempt = attempt + 1, lease_until = now() + interval '5 min' WHERE id = %s",
                (attempt.id,),
            )
        assert not await attempt.fence().begin_write()
        return Done("stale")

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await db.adrain()
    # The stale Done named epoch 1; the row is at epoch 2 and unchanged by it.
    assert db.rows(
        "SELECT state, epoch, readback_ref FROM {schema}.agent_action WHERE id = %s", (action_id,)
    ) == [("EXECUTING", 2, None)]


async def test_domain_writes_under_the_lease_commit_while_the_epoch_holds(
    db: OutboxTestDatabase,
) -> None:
    db.execute("CREATE TABLE public.domain_row (action_id bigint, note text)")

    async def run(attempt: ActionAttempt) -> AdapterResult:
        async with attempt.transaction() as conn:
            await conn.execute("INSERT INTO public.domain_row VALUES (%s, 'kept')", (attempt.id,))
        return Done()

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await db.adrain()
    assert db.rows("SELECT * FROM public.domain_row") == [(action_id, "kept")]


async def test_domain_writes_are_refused_once_the_epoch_moved_on(db: OutboxTestDatabase) -> None:
    db.execute("CREATE TABLE public.domain_row (action_id bigint, note text)")
    raised: list[str] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        with db.connect(autocommit=True) as conn:
            conn.execute(
                f"UPDATE \"{db.schema}\".agent_action SET lease_until = now() - interval '1 s' WHERE id = %s",
                (attempt.id,),
            )
            conn.execute(
                f"UPDATE \"{db.schema}\".agent_action SET epoch = epoch + 1, attempt = attempt + 1, lease_until = now() + interval '5 min' WHERE id = %s",
                (attempt.id,),
            )
        try:
            async with attempt.transaction() as conn:
                await conn.execute(
                    "INSERT INTO public.domain_row VALUES (%s, 'lost')", (attempt.id,)
                )
        except LeaseLost as exc:
            raised.append(str(exc))
        return Abandoned()

    ScriptedAdapter.script = run
    enqueue(db)
    await db.adrain()
    assert raised and "no longer holds it" in raised[0]
    assert db.rows("SELECT * FROM public.domain_row") == []


async def test_begin_write_inside_the_lease_transaction_is_refused_clearly(
    db: OutboxTestDatabase,
) -> None:
    from outbox_core import OutboxError

    messages: list[str] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        async with attempt.transaction():
            with pytest.raises(OutboxError) as caught:
                await attempt.fence().begin_write()
            messages.append(str(caught.value))
        return Done()

    ScriptedAdapter.script = run
    enqueue(db)
    await db.adrain()
    assert messages and "would wait on its own row lock" in messages[0]


def test_a_fence_changes_no_indexed_column_and_its_table_keeps_room(
    db: OutboxTestDatabase,
) -> None:
    """A fence can be a HOT update beside the claim's row version (no new entry in any of the
    table's indexes) when it changes no column an index names and the page has room: migration
    0007 kept 30 % of each page free (at the default fillfactor the claim had just filled the
    page, and nearly every fence wrote an entry in every index), migration 0021 half of it, for
    the claim's and the ending's versions too (test_hot_layout.py). These are the premises, checked
    in the catalogs; how many fences are HOT on a given server also depends on page pruning, so
    on what else runs there, and is measured in bench/hot_fences.py (docs/benchmarks.md)."""
    fence = db.outbox.queries["begin_write"]
    update = re.search(r"UPDATE \S+\.agent_action a\s+SET (.*?)\s+WHERE", fence, re.S)
    assert update is not None, fence
    assert re.findall(r"(\w+) =", update.group(1)) == ["write_started_at"]
    naming = db.rows(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname = 'write_started_at' "
        "WHERE i.indrelid = '{schema}.agent_action'::regclass "
        "AND (a.attnum = ANY (i.indkey) "
        "OR coalesce(pg_get_expr(i.indpred, i.indrelid), '') LIKE '%%write_started_at%%' "
        "OR coalesce(pg_get_expr(i.indexprs, i.indrelid), '') LIKE '%%write_started_at%%')"
    )
    assert naming == [], f"indexes that name write_started_at: {naming}"
    options = db.scalar(
        "SELECT reloptions FROM pg_class WHERE oid = '{schema}.agent_action'::regclass"
    )
    assert options == ["fillfactor=50"]


async def test_a_fence_neither_waits_for_another_fences_busy_row_nor_passes_without_the_margin(
    db: OutboxTestDatabase,
) -> None:
    """Attempt A's action is being erased (an erasure holds its row, uncommitted) while an
    unrelated attempt B fences in the same batch. One statement for the batch waited for the
    erasure, and then passed B on the margin read when the statement began. The erasure
    commits only once B's fence has answered (or after 30 s): B must answer before it."""
    arrived: list[str] = []
    both, go, b_ready, b_answered = (asyncio.Event() for _ in range(4))
    seen: dict[str, Any] = {}
    background: list[asyncio.Task[Any]] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        arrived.append(attempt.idempotency_key)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        if attempt.idempotency_key == "B":
            await go.wait()  # A's row is held by the erasure
            db.execute(  # B: just over the margin of lease left
                "UPDATE {schema}.agent_action SET lease_until = now() + interval '61.5 s' "
                "WHERE id = %s",
                (attempt.id,),
            )
            b_ready.set()
            seen["B"] = await attempt.fence().begin_write()
            seen["B before the erasure committed"] = not seen.get("erasure committed", False)
            b_answered.set()
            seen["B left"] = db.scalar(
                "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8 "
                "FROM {schema}.agent_action WHERE id = %s",
                (attempt.id,),
            )
            return Done() if seen["B"] else Abandoned()
        conn = await db.aconnect()
        await erase_subject(conn, "person-1", outbox=db.outbox)

        async def commit_later() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(b_answered.wait(), 30)
            seen["erasure committed"] = True
            await conn.commit()
            await conn.close()

        background.append(asyncio.create_task(commit_later()))
        go.set()
        await b_ready.wait()  # both fences go out together
        seen["A"] = await attempt.fence().begin_write()  # busy: asked again until it is gone
        return Abandoned()

    ScriptedAdapter.script = run
    with db.connect() as conn:
        db.outbox.enqueue(
            conn, ActionRequest("TEST_SCRIPTED", "a", "A", subject_account_id="person-1")
        )
        db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "b", "B"))
        conn.commit()
    await db.adrain()
    await asyncio.gather(*background)
    assert seen["A"] is False  # erased
    assert seen["B"] is True and seen["B before the erasure committed"], seen
    assert seen["B left"] >= 59.0, seen


async def test_a_domain_transaction_cannot_outlive_the_lease_and_stall_a_reclaim(
    db: OutboxTestDatabase,
) -> None:
    """The transaction holds the action's row, which a reclaim waits for. A holder that stalls
    inside it past the lease (a blocked event loop, a paused machine) held up another
    replica's whole claim batch, and every enqueue into those lanes. The server now ends the
    transaction once the lease is over: the other replica's claim returns while the holder
    still stalls (it stalls until that claim returned, or 60 s)."""
    db.execute("CREATE TABLE public.domain_row (action_id bigint, note text)")
    inside, claimed = asyncio.Event(), asyncio.Event()
    outcome: list[str] = []
    stalled: list[bool] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.idempotency_key != "A" or attempt.epoch > 1:
            return Done()
        db.execute(
            "UPDATE {schema}.agent_action SET lease_until = now() + interval '1 s' WHERE id = %s",
            (attempt.id,),
        )
        try:
            async with attempt.transaction() as conn:
                await conn.execute(
                    "INSERT INTO public.domain_row VALUES (%s, 'late')", (attempt.id,)
                )
                inside.set()
                # Stalls past its lease, idle in its transaction.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(claimed.wait(), 60)
                stalled.append(True)
        except LeaseLost as exc:
            outcome.append(str(exc))
        return Abandoned()

    ScriptedAdapter.script = run
    enqueue(db, lane="a", key="A")
    holder = asyncio.create_task(db.adrain())
    await asyncio.wait_for(inside.wait(), 30)
    enqueue(db, lane="b", key="B")  # an unrelated lane
    db.execute("UPDATE {schema}.action_lane SET next_at = now()")
    await await_for(  # A's lease is over
        lambda: ascalar(
            db,
            "SELECT lease_until < now() FROM {schema}.agent_action WHERE idempotency_key = 'A'",
        ),
        30,
        "A's lease to run out",
    )
    async with db.executor() as other:
        rows, _ = await other.claims.claim(10)
        returned_while_stalled = not stalled
        claimed.set()
        await asyncio.gather(*other.attempts.dispatch(rows))
        await other.settle()
    await holder
    assert returned_while_stalled, "the other replica's claim waited for the stalled holder"
    assert sorted((row[0], row[5]) for row in rows if row[0] != "visited") == [
        ("claim", "B"),
        ("reclaim", "A"),
    ]
    assert len(outcome) == 1 and "its lease ran out inside the transaction" in outcome[0]
    assert db.rows("SELECT * FROM public.domain_row") == []


async def test_a_domain_transaction_is_refused_once_the_lease_is_over(
    db: OutboxTestDatabase,
) -> None:
    raised: list[str] = []

    async def run(attempt: ActionAttempt) -> AdapterResult:
        db.execute(
            "UPDATE {schema}.agent_action SET lease_until = now() - interval '1 s' WHERE id = %s",
            (attempt.id,),
        )
        try:
            async with attempt.transaction():
                pass
        except LeaseLost as exc:
            raised.append(str(exc))
        return Abandoned()

    ScriptedAdapter.script = run
    enqueue(db)
    await db.adrain()
    assert raised and "its lease is over" in raised[0]
