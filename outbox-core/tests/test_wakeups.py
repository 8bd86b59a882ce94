"""Wake-ups (migration 0016): an enqueue of an admitted action notifies the schema's channel
when an executor waits for one, and never otherwise, so that concurrent producers keep their
group commit while the executors are busy. An executor registers before it waits, claims at
once and again whenever fewer of the transactions that may have missed its registration run;
it registers again at each poll, and leaves once it has been busy for a while."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outbox_core import ActionAttempt, ActionRequest, AdapterResult, Done
from outbox_core.executor import Executor
from outbox_core.executor.waiting import BUSY_SECONDS
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .test_concurrency import listening


@contextmanager
def listener(db: OutboxTestDatabase, *, waiting: bool = True) -> Iterator[psycopg.Connection]:
    """A connection that LISTENs as an executor does, registered as waiting (or not)."""
    with db.connect(autocommit=True) as conn:
        conn.execute(f'LISTEN "{db.outbox.channel}"')
        if waiting:
            db.execute(
                "INSERT INTO {schema}.executor_waiting (listener_pid) VALUES (%s)",
                (conn.info.backend_pid,),
            )
        yield conn


def heard(conn: psycopg.Connection, timeout: float = 0.3) -> int:
    """The notifications that arrive within ``timeout``."""
    return len(list(conn.notifies(timeout=timeout)))


def heard_once(conn: psycopg.Connection) -> bool:
    """Whether one notification arrives (waiting up to 30 s for it), and no other after it."""
    return len(list(conn.notifies(timeout=30, stop_after=1))) == 1 and heard(conn) == 0


def test_an_enqueue_wakes_a_waiting_executor_when_the_caller_commits(
    db: OutboxTestDatabase,
) -> None:
    with listener(db) as executor, db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "wake"))
        assert heard(executor) == 0
        producer.commit()
        assert [n.channel for n in executor.notifies(timeout=30, stop_after=1)] == [
            db.outbox.channel
        ]


def test_with_no_executor_waiting_an_enqueue_notifies_nobody(db: OutboxTestDatabase) -> None:
    with listener(db, waiting=False) as conn, db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "quiet"))
        db.outbox.enqueue_many(producer, [ActionRequest("TEST_NOOP", "other", "quiet-2")])
        producer.commit()
        assert heard(conn) == 0


def test_every_admitted_enqueue_wakes_a_waiting_executor(db: OutboxTestDatabase) -> None:
    """Behind its lane's head and not yet due too: the head may be one that a claim skipped
    while this enqueue held its lane's row."""
    later = datetime.now(UTC) + timedelta(hours=1)
    with listener(db) as executor, db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "head"))
        producer.commit()
        assert heard_once(executor)
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "behind"))
        producer.commit()
        assert heard_once(executor)
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "b", "later", not_before=later))
        producer.commit()
        assert heard_once(executor)


def test_a_proposal_wakes_nobody_until_it_is_admitted(db: OutboxTestDatabase) -> None:
    with listener(db) as executor, db.connect() as producer:
        proposal = db.outbox.enqueue(
            producer, ActionRequest("TEST_NOOP", "a", "proposed", proposed=True)
        )
        producer.commit()
        assert heard(executor) == 0
        assert db.outbox.admit(producer, proposal.id)
        producer.commit()
        assert heard_once(executor)


def test_a_batch_over_new_lanes_wakes_once(db: OutboxTestDatabase) -> None:
    with listener(db) as executor, db.connect() as producer:
        db.outbox.enqueue_many(
            producer, [ActionRequest("TEST_NOOP", f"lane-{i}", f"k-{i}") for i in range(20)]
        )
        producer.commit()
        assert heard_once(executor)


def test_a_repeatable_read_producer_always_notifies(db: OutboxTestDatabase) -> None:
    """Its snapshot may predate a registration that an executor made meanwhile."""
    with listener(db, waiting=False) as conn, db.connect() as producer:
        producer.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "rr"))
        producer.commit()
        assert heard_once(conn)


def test_a_callers_search_path_decides_nothing_in_the_wake_check(db: OutboxTestDatabase) -> None:
    """wake_wanted_v1 is SECURITY DEFINER without a SET clause (migration 0017): every name in
    it is qualified, so a caller's schema placed before pg_catalog cannot change its answer."""
    with db.connect() as conn:
        conn.execute("CREATE SCHEMA shadow")
        conn.execute(
            "CREATE FUNCTION shadow.current_setting(text) RETURNS text "
            "LANGUAGE sql AS $$ SELECT 'serializable' $$"
        )
        conn.execute(
            "CREATE FUNCTION shadow.differ(text, text) RETURNS boolean "
            "LANGUAGE sql AS $$ SELECT true $$"
        )
        conn.execute(
            "CREATE OPERATOR shadow.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = shadow.differ)"
        )
        conn.execute("SET search_path = shadow, pg_catalog")
        # The shadows answer for an unqualified name: the check below would notify with them.
        assert conn.execute("SELECT current_setting('x') <> 'read committed'").fetchone() == (True,)
        wake = f'SELECT "{db.schema}".wake_wanted_v1()'
        assert conn.execute(wake).fetchone() == (False,)
        db.execute("INSERT INTO {schema}.executor_waiting (listener_pid) VALUES (0)")
        assert conn.execute(wake).fetchone() == (True,)
        conn.rollback()


def registered(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.executor_waiting"))


async def until(condition: object, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(
    db: OutboxTestDatabase, *, registered_first: bool = True, **settings: Any
) -> AsyncIterator[Executor]:
    """An executor's run loop (by default once it has registered: idle, its first claim found
    nothing), stopped and closed at the end."""
    stop = asyncio.Event()
    executor = db.executor(**settings)
    runner = asyncio.create_task(executor.run(stop))
    try:
        if registered_first:
            await until(lambda: registered(db) == 1, "the executor did not register")
        yield executor
    finally:
        stop.set()
        await runner
        await executor.close()


def done(db: OutboxTestDatabase, key: str) -> bool:
    state = db.scalar("SELECT state FROM {schema}.agent_action WHERE idempotency_key = %s", (key,))
    return bool(state == "DONE")


async def test_an_enqueue_that_missed_the_registration_starts_when_its_transaction_ends(
    db: OutboxTestDatabase,
) -> None:
    """The producer inserts (and finds nobody waiting) before the executor registers, and
    commits after: it does not notify, and the executor claims when that transaction has
    ended, not at its poll (an hour here)."""
    with db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "missed"))
        async with running(db, poll_seconds=3600.0):
            await asyncio.sleep(0.2)  # it waits, watching the producer's transaction
            producer.commit()
            await until(lambda: done(db, "missed"), "the executor waited for its poll")
    assert registered(db) == 0  # it left as it stopped


async def test_a_head_that_a_claim_skipped_while_a_second_producer_held_its_lane_starts_at_once(
    db: OutboxTestDatabase,
) -> None:
    """The first producer's commit wakes the executor, whose claim skips the lane the second
    producer's enqueue holds; the second producer's commit (behind the head) wakes it again."""
    async with running(db, poll_seconds=3600.0):
        with db.connect() as first, db.connect() as second:
            db.outbox.enqueue(first, ActionRequest("TEST_NOOP", "hot", "head"))
            enqueued = asyncio.get_running_loop().run_in_executor(
                None,
                lambda: db.outbox.enqueue(second, ActionRequest("TEST_NOOP", "hot", "behind")),
            )
            await asyncio.sleep(0.2)  # the second waits for the lane's row
            first.commit()
            await enqueued  # now the second holds the row, and the claim skips the lane
            await asyncio.sleep(0.2)
            second.commit()
        await until(lambda: done(db, "head") and done(db, "behind"), "the head waited the poll")


async def test_a_producer_whose_id_came_after_the_registrations_is_watched_too(
    db: OutboxTestDatabase,
) -> None:
    """A registration that commits after a producer drew its id and checked: the snapshot the
    executor takes then lists no running id at or above its xmax, which the producer's may be;
    the id drawn after the registration covers it."""
    db.execute(
        "CREATE FUNCTION {schema}.slow_registration() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$"
    )
    # AFTER the row: the registration's transaction has its id while it sleeps.
    db.execute(
        "CREATE TRIGGER slow AFTER INSERT ON {schema}.executor_waiting "
        "FOR EACH ROW EXECUTE FUNCTION {schema}.slow_registration()"
    )
    async with running(db, registered_first=False, poll_seconds=3600.0):
        await until(
            lambda: (
                db.scalar(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE query LIKE '-- waiting_register%%' AND state = 'active'"
                )
                == 1
            ),
            "the executor did not start registering",
        )
        with db.connect() as producer:
            # Its id comes after the registration's; its check finds no row committed yet.
            db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "late-id"))
            await until(lambda: registered(db) == 1, "the registration did not commit")
            await asyncio.sleep(0.2)
            producer.commit()
        await until(lambda: done(db, "late-id"), "the executor waited for its poll")


async def test_an_unrelated_long_transaction_delays_nothing(db: OutboxTestDatabase) -> None:
    """A transaction that runs through the registration and never enqueues keeps being watched;
    the producer that missed the registration starts when it commits, not at the poll."""
    with db.connect() as unrelated, db.connect() as producer:
        unrelated.execute("SELECT pg_current_xact_id()")  # an id, and it stays open
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "missed"))
        async with running(db, poll_seconds=3600.0):
            await asyncio.sleep(0.2)
            producer.commit()
            await until(lambda: done(db, "missed"), "the executor waited for its poll")


async def test_a_row_removed_from_under_an_idle_executor_comes_back_at_its_next_poll(
    db: OutboxTestDatabase,
) -> None:
    async with running(db, poll_seconds=0.5):
        db.execute("DELETE FROM {schema}.executor_waiting")
        await until(lambda: registered(db) == 1, "the row did not come back")
        with db.connect() as producer:
            db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "after"))
            producer.commit()
        await until(lambda: done(db, "after"), "the action did not start")


async def test_a_busy_executor_stops_asking_for_wake_ups_and_asks_again_when_idle(
    db: OutboxTestDatabase,
) -> None:
    """Idle, it has a row; with every place taken for longer than BUSY_SECONDS the row goes;
    idle again, it is back."""

    async def slow(attempt: ActionAttempt) -> AdapterResult:
        await asyncio.sleep(0.2)
        return Done()

    ScriptedAdapter.script = slow
    async with running(db, concurrency=1):
        with db.connect() as conn:
            db.outbox.enqueue_many(
                conn,
                [
                    ActionRequest("TEST_SCRIPTED", f"lane-{i}", f"slow-{i}", {"n": 0})
                    for i in range(int(BUSY_SECONDS / 0.2) * 3)
                ],
            )
            conn.commit()
        await until(lambda: registered(db) == 0, "the busy executor kept its row")
        assert db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state <> 'DONE'") > 0
        await until(
            lambda: (
                db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state <> 'DONE'") == 0
            ),
            "the backlog did not finish",
        )
        await until(lambda: registered(db) == 1, "the idle executor did not register again")


async def test_the_row_of_an_executor_that_is_gone_is_swept(db: OutboxTestDatabase) -> None:
    with db.connect(autocommit=True) as gone:
        pid = gone.info.backend_pid
        db.execute("INSERT INTO {schema}.executor_waiting (listener_pid) VALUES (%s)", (pid,))
    await until(
        lambda: db.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == 0,
        "the connection did not end",
    )
    async with Executor(db.outbox, db.url, settings=db.settings) as executor:
        await executor.maintenance.sweep_waiting()
    assert registered(db) == 0


async def test_an_idle_executor_registers_the_backend_it_listens_on(
    db: OutboxTestDatabase,
) -> None:
    async with running(db, poll_seconds=3600.0):
        await listening(db, 1)
        assert db.scalar(
            "SELECT a.query FROM {schema}.executor_waiting w "
            "JOIN pg_stat_activity a ON a.pid = w.listener_pid"
        ).startswith("LISTEN")


async def test_a_registration_that_failed_is_tried_again_within_a_second_not_at_the_poll(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Without its row producers do not notify it, so a failed registration (the first statement
    after a failover may meet a pool connection that died with the old primary) would leave
    every enqueue to the poll."""
    caplog.set_level(logging.WARNING, logger="outbox")
    db.execute("ALTER TABLE {schema}.executor_waiting RENAME TO executor_waiting_away")

    def failures() -> int:
        return sum(
            1 for r in caplog.records if getattr(r, "event", None) == "executor.waiting.failed"
        )

    async with running(db, registered_first=False, poll_seconds=3600.0):
        # Tried again and again while the table is away (a wake-up may explain a second try,
        # not a third), then it registers once it is back.
        await until(lambda: failures() >= 3, "not tried again before the poll", seconds=60.0)
        db.execute("ALTER TABLE {schema}.executor_waiting_away RENAME TO executor_waiting")
        await until(lambda: registered(db) == 1, "not registered again", seconds=60.0)
