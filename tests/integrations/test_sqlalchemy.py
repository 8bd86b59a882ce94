"""outbox_core.integrations.sqlalchemy: the action commits and rolls back with the session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import URL, Engine, Integer, String, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox_core import ActionRequest
from outbox_core.integrations import UnsupportedDriver
from outbox_core.integrations.sqlalchemy import aenqueue, enqueue
from outbox_core.testing import OutboxTestDatabase

from .conftest import action_count, order_count
from .kinds import ConfirmAdapter, Confirmation


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    __table_args__ = {"schema": "public"}
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String)


def url(db: OutboxTestDatabase, driver: str) -> URL:
    """The test database's connection string as a SQLAlchemy URL for ``driver``."""
    params = conninfo_to_dict(db.url)
    host, port = str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)
    query: dict[str, str] = {}
    if host.startswith("/"):  # a Unix socket's folder: each driver names it its own way
        if driver == "pg8000":
            query["unix_sock"] = f"{host}/.s.PGSQL.{port}"
        else:
            query["host"] = host
        host = ""
    return URL.create(
        f"postgresql+{driver}",
        username=str(params.get("user") or "postgres"),
        password=str(params["password"]) if params.get("password") else None,
        host=host or None,
        port=port if host else None,
        database=str(params["dbname"]),
        query=query,
    )


def confirm(order_id: int) -> ActionRequest:
    return ActionRequest(
        "TEST_CONFIRM", f"order:{order_id}", f"confirm:{order_id}", Confirmation(order_id=order_id)
    )


@pytest.fixture
def engine(db: OutboxTestDatabase) -> Iterator[Engine]:
    engine = create_engine(url(db, "psycopg"))
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(db: OutboxTestDatabase) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(url(db, "psycopg"))
    yield engine
    await engine.dispose()


def test_an_action_enqueued_in_a_committed_session_runs(
    db: OutboxTestDatabase, engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(id=1, item="tea"))
        enqueued = enqueue(session, confirm(1), outbox=db.outbox)
    assert enqueued.created
    db.drain()
    assert ConfirmAdapter.ran == [enqueued.id]
    assert order_count(db) == 1


def test_a_rolled_back_session_leaves_no_action(db: OutboxTestDatabase, engine: Engine) -> None:
    with Session(engine) as session:
        session.add(Order(id=1, item="tea"))
        session.flush()
        enqueue(session, confirm(1), outbox=db.outbox)
        session.rollback()
    assert action_count(db) == 0
    assert order_count(db) == 0


def test_a_rolled_back_savepoint_leaves_no_action_and_the_rest_commits(
    db: OutboxTestDatabase, engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(id=1, item="tea"))
        nested = session.begin_nested()
        enqueue(session, confirm(1), outbox=db.outbox)
        nested.rollback()
    assert action_count(db) == 0
    assert order_count(db) == 1


def test_a_second_enqueue_of_the_same_key_returns_the_first_action(
    db: OutboxTestDatabase, engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        first = enqueue(session, confirm(1), outbox=db.outbox)
    with Session(engine) as session, session.begin():
        second = enqueue(session, confirm(1), outbox=db.outbox)
    assert first.created and not second.created
    assert second.id == first.id
    assert action_count(db) == 1


def test_a_session_on_another_driver_is_refused_before_anything_is_written(
    db: OutboxTestDatabase,
) -> None:
    engine = create_engine(url(db, "pg8000"))
    try:
        with Session(engine) as session, pytest.raises(UnsupportedDriver, match="psycopg"):
            enqueue(session, confirm(1), outbox=db.outbox)
    finally:
        engine.dispose()
    assert action_count(db) == 0


async def test_an_action_enqueued_in_a_committed_async_session_runs(
    db: OutboxTestDatabase, async_engine: AsyncEngine
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        session.add(Order(id=1, item="tea"))
        enqueued = await aenqueue(session, confirm(1), outbox=db.outbox)
    await db.adrain()
    assert ConfirmAdapter.ran == [enqueued.id]
    assert order_count(db) == 1


async def test_a_rolled_back_async_session_leaves_no_action(
    db: OutboxTestDatabase, async_engine: AsyncEngine
) -> None:
    async with AsyncSession(async_engine) as session:
        session.add(Order(id=1, item="tea"))
        await session.flush()
        await aenqueue(session, confirm(1), outbox=db.outbox)
        await session.rollback()
    assert action_count(db) == 0
    assert order_count(db) == 0


async def test_a_rolled_back_async_savepoint_leaves_no_action(
    db: OutboxTestDatabase, async_engine: AsyncEngine
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        session.add(Order(id=1, item="tea"))
        nested = await session.begin_nested()
        await aenqueue(session, confirm(1), outbox=db.outbox)
        await nested.rollback()
    assert action_count(db) == 0
    assert order_count(db) == 1


async def test_a_second_async_enqueue_of_the_same_key_returns_the_first_action(
    db: OutboxTestDatabase, async_engine: AsyncEngine
) -> None:
    async with AsyncSession(async_engine) as session, session.begin():
        first = await aenqueue(session, confirm(1), outbox=db.outbox)
        second = await aenqueue(session, confirm(1), outbox=db.outbox)
    assert first.created and not second.created
    assert second.id == first.id


async def test_an_async_session_on_another_driver_is_refused(db: OutboxTestDatabase) -> None:
    engine = create_async_engine(url(db, "asyncpg"))
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(UnsupportedDriver, match="postgresql\\+asyncpg"):
                await aenqueue(session, confirm(1), outbox=db.outbox)
    finally:
        await engine.dispose()
    assert action_count(db) == 0
