"""What works through PgBouncer 1.18 in transaction pooling (``pool_mode = transaction``):
every enqueue path (``enqueue``, ``aenqueue``, ``enqueue_many``, the SQLAlchemy session's and
Django's atomic block) on connections made with ``prepare_threshold=None`` (Django's default on
psycopg 3). With psycopg's default threshold a query run 5 times on a connection is prepared on
the server session it happened to run on; the enqueue that later runs on another session is
refused with :class:`PreparedStatementsLost`, which says what to do (docs/operations.md, "A
connection pooler").

Each test makes the pooler move a client between server sessions: the first client enqueues
past the threshold, then the second holds, in a transaction, the session the first just gave
back, and the first enqueues again on another one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.engine import URL, Connection
from sqlalchemy.orm import Session

from outbox_core import ActionRequest, PreparedStatementsLost
from outbox_core.integrations import django as django_integration
from outbox_core.integrations import sqlalchemy as sqlalchemy_integration
from outbox_core.testing import OutboxTestDatabase

from ..integrations.kinds import Confirmation
from ..integrations.test_django import django_database

RUNS = 8  # past psycopg's prepare_threshold (5): the 6th run of a query on a connection prepares it
BATCH = 3  # requests per enqueue_many


def confirm(n: int) -> ActionRequest:
    return ActionRequest("TEST_CONFIRM", f"order:{n}", f"confirm:{n}", Confirmation(order_id=n))


def moved_between_sessions(
    first: Any,
    second: Any,
    enqueue: Callable[[Any, int], None],
    holding: Callable[[Any], AbstractContextManager[None]],
) -> int:
    """Enqueue on ``first`` RUNS times, then once more while ``second`` holds the server
    session ``first`` used, then on ``second``; how many enqueues were made."""
    for n in range(RUNS):
        enqueue(first, n)
    with holding(second):
        enqueue(first, RUNS)
    enqueue(second, RUNS + 1)
    return RUNS + 2


def actions(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


# -- psycopg connections -------------------------------------------------------------------


def psycopg_clients(url: str, **options: Any) -> AbstractContextManager[tuple[Any, Any]]:
    @contextmanager
    def clients() -> Iterator[tuple[Any, Any]]:
        with psycopg.connect(url, **options) as first, psycopg.connect(url, **options) as second:
            yield first, second

    return clients()


@contextmanager
def holding_psycopg(conn: psycopg.Connection[Any]) -> Iterator[None]:
    with conn.transaction():
        conn.execute("SELECT 1")
        yield


def test_enqueue_through_transaction_pooling_with_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    def enqueue(conn: psycopg.Connection[Any], n: int) -> None:
        with conn.transaction():
            db.outbox.enqueue(conn, confirm(n))

    with psycopg_clients(pooled_url, prepare_threshold=None) as (first, second):
        made = moved_between_sessions(first, second, enqueue, holding_psycopg)
    assert actions(db) == made


def test_enqueue_many_through_transaction_pooling_with_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    def enqueue(conn: psycopg.Connection[Any], n: int) -> None:
        with conn.transaction():
            db.outbox.enqueue_many(conn, [confirm(n * BATCH + i) for i in range(BATCH)])

    with psycopg_clients(pooled_url, prepare_threshold=None) as (first, second):
        made = moved_between_sessions(first, second, enqueue, holding_psycopg)
    assert actions(db) == made * BATCH


@pytest.mark.parametrize("bulk", [False, True], ids=["enqueue", "enqueue_many"])
def test_an_enqueue_whose_prepared_statement_the_pooler_lost_says_to_set_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str, bulk: bool
) -> None:
    def enqueue(conn: psycopg.Connection[Any], n: int) -> None:
        with conn.transaction():
            if bulk:
                db.outbox.enqueue_many(conn, [confirm(n * BATCH + i) for i in range(BATCH)])
            else:
                db.outbox.enqueue(conn, confirm(n))

    with (
        psycopg_clients(pooled_url) as (first, second),  # psycopg's default threshold
        pytest.raises(PreparedStatementsLost, match="prepare_threshold=None") as refused,
    ):
        moved_between_sessions(first, second, enqueue, holding_psycopg)
    assert isinstance(refused.value.__cause__, psycopg.errors.InvalidSqlStatementName)
    assert actions(db) == RUNS * (BATCH if bulk else 1)  # the refused one wrote nothing


# -- async ---------------------------------------------------------------------------------


async def amoved_between_sessions(db: OutboxTestDatabase, url: str, **options: Any) -> int:
    """:func:`moved_between_sessions` with ``aenqueue`` on async connections."""

    async def enqueue(conn: psycopg.AsyncConnection[Any], n: int) -> None:
        async with conn.transaction():
            await db.outbox.aenqueue(conn, confirm(n))

    @asynccontextmanager
    async def holding(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
        async with conn.transaction():
            await conn.execute("SELECT 1")
            yield

    connect = psycopg.AsyncConnection.connect
    async with await connect(url, **options) as first, await connect(url, **options) as second:
        for n in range(RUNS):
            await enqueue(first, n)
        async with holding(second):
            await enqueue(first, RUNS)
        await enqueue(second, RUNS + 1)
    return RUNS + 2


async def test_aenqueue_through_transaction_pooling_with_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    made = await amoved_between_sessions(db, pooled_url, prepare_threshold=None)
    assert actions(db) == made


async def test_an_aenqueue_whose_prepared_statement_the_pooler_lost_says_to_set_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    with pytest.raises(PreparedStatementsLost, match="prepare_threshold=None"):
        await amoved_between_sessions(db, pooled_url)
    assert actions(db) == RUNS


# -- the ORMs ------------------------------------------------------------------------------


def test_a_sqlalchemy_session_enqueues_through_transaction_pooling_with_prepare_threshold_none(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    params = conninfo_to_dict(pooled_url)
    engine = create_engine(
        URL.create(
            "postgresql+psycopg",
            username=str(params.get("user") or "postgres"),
            host=str(params["host"]),
            port=int(str(params["port"])),
            database=str(params["dbname"]),
        ),
        connect_args={"prepare_threshold": None},  # what docs/operations.md says to set
    )

    def enqueue(conn: Connection, n: int) -> None:
        with Session(bind=conn) as session, session.begin():
            sqlalchemy_integration.enqueue(session, confirm(n), outbox=db.outbox)

    @contextmanager
    def holding(conn: Connection) -> Iterator[None]:
        with conn.begin():
            conn.exec_driver_sql("SELECT 1")
            yield

    try:
        with engine.connect() as first, engine.connect() as second:
            made = moved_between_sessions(first, second, enqueue, holding)
    finally:
        engine.dispose()
    assert actions(db) == made


def test_django_enqueues_through_transaction_pooling_with_its_default_options(
    db: OutboxTestDatabase, pooled_url: str
) -> None:
    """Django 4.2+ on psycopg 3 connects with ``prepare_threshold=None`` unless OPTIONS say
    otherwise, and with client-side binding: nothing to set."""
    params = conninfo_to_dict(pooled_url)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params["dbname"],
        "USER": params.get("user") or "postgres",
        "HOST": params["host"],
        "PORT": params["port"],
    }
    from django.db import connections, transaction

    def enqueue(alias: str, n: int) -> None:
        with transaction.atomic(using=alias):
            django_integration.enqueue(confirm(n), using=alias, outbox=db.outbox)

    @contextmanager
    def holding(alias: str) -> Iterator[None]:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            yield

    first, second = (f"pooled_{uuid.uuid4().hex[:8]}" for _ in range(2))
    with django_database(first, database), django_database(second, database):
        made = moved_between_sessions(first, second, enqueue, holding)
    assert actions(db) == made
