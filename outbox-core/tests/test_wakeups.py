"""Wake-ups (migration 0016): an enqueue notifies the schema's channel when its commit can start
an action (the action is its lane's head and due) and an executor waits for one; never
otherwise, so that concurrent producers keep their group commit. An executor registers before
it waits, and claims once more when the transactions that may have missed its registration
have ended; it leaves once it has been busy for a while."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg

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


def test_an_action_behind_its_lanes_head_wakes_nobody(db: OutboxTestDatabase) -> None:
    with listener(db) as executor, db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "head"))
        producer.commit()
        assert heard_once(executor)
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "behind"))
        db.outbox.enqueue_many(producer, [ActionRequest("TEST_NOOP", "lane", "behind-2")])
        producer.commit()
        assert heard(executor) == 0


def test_a_proposal_and_an_action_not_yet_due_wake_nobody_until_one_is_due(
    db: OutboxTestDatabase,
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    with listener(db) as executor, db.connect() as producer:
        proposal = db.outbox.enqueue(
            producer, ActionRequest("TEST_NOOP", "a", "proposed", proposed=True)
        )
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "b", "later", not_before=later))
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


def registered(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.executor_waiting"))


async def until(condition: object, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_an_enqueue_that_missed_the_registration_starts_when_its_transaction_ends(
    db: OutboxTestDatabase,
) -> None:
    """The producer inserts (and finds nobody waiting) before the executor registers, and
    commits after: it does not notify, and the executor claims once the transactions that
    were running at its registration have ended, not at its poll (an hour here)."""
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=3600.0)
    with db.connect() as producer:
        db.outbox.enqueue(producer, ActionRequest("TEST_NOOP", "lane", "missed"))
        runner = asyncio.create_task(executor.run(stop))
        try:
            await until(lambda: registered(db) == 1, "the executor did not register")
            await asyncio.sleep(0.2)  # it waits, watching the producer's transaction
            producer.commit()
            await until(
                lambda: db.scalar("SELECT state FROM {schema}.agent_action") == "DONE",
                "the executor waited for its poll",
            )
        finally:
            stop.set()
            await runner
            await executor.close()
    assert registered(db) == 0  # it left as it stopped


async def test_a_busy_executor_stops_asking_for_wake_ups_and_asks_again_when_idle(
    db: OutboxTestDatabase,
) -> None:
    """Idle, it has a row; with every place taken for longer than BUSY_SECONDS the row goes;
    idle again, it is back."""

    async def slow(attempt: ActionAttempt) -> AdapterResult:
        await asyncio.sleep(0.2)
        return Done()

    ScriptedAdapter.script = slow
    stop = asyncio.Event()
    executor = db.executor(concurrency=1)
    runner = asyncio.create_task(executor.run(stop))
    try:
        await until(lambda: registered(db) == 1, "the idle executor did not register")
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
    finally:
        stop.set()
        await runner
        await executor.close()


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
    stop = asyncio.Event()
    executor = db.executor(poll_seconds=3600.0)
    runner = asyncio.create_task(executor.run(stop))
    try:
        await listening(db, 1)
        await until(lambda: registered(db) == 1, "the idle executor did not register")
        assert db.scalar(
            "SELECT a.query FROM {schema}.executor_waiting w "
            "JOIN pg_stat_activity a ON a.pid = w.listener_pid"
        ).startswith("LISTEN")
    finally:
        stop.set()
        await runner
        await executor.close()
