"""Enqueue in a SQLAlchemy session's own transaction (extra ``outbox-core[sqlalchemy]``).

::

    from outbox_core import ActionRequest
    from outbox_core.integrations.sqlalchemy import enqueue

    with Session(engine) as session, session.begin():
        session.add(order)
        enqueue(session, ActionRequest("EMAIL", f"order:{order.id}", f"confirm:{order.id}"))

The session's engine must use psycopg 3 (``postgresql+psycopg://``, also for
``create_async_engine``): the statements run on the session's own psycopg connection, inside
the transaction (or savepoint, ``session.begin_nested()``) that the session has open, so the
action exists exactly when the session commits. Any other driver is refused with
:class:`~outbox_core.integrations.UnsupportedDriver` before anything is written.
"""

from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ..outbox import Outbox, default_outbox
from ..requests import ActionRequest, Enqueued
from . import UnsupportedDriver

__all__ = ["aenqueue", "enqueue"]


def _check_driver(connection: SAConnection, raw: object, expected: type) -> None:
    dialect = connection.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg" or not isinstance(raw, expected):
        raise UnsupportedDriver(
            f"the session's engine uses {dialect.name}+{dialect.driver}; the outbox enqueues "
            "on the session's own connection and needs psycopg 3 on PostgreSQL: create the "
            "engine with a postgresql+psycopg:// URL"
        )


def enqueue(session: Session, request: ActionRequest, *, outbox: Outbox | None = None) -> Enqueued:
    """Enqueue ``request`` on ``session``'s connection, in its current transaction (begun here
    if the session has none yet, as any ORM statement would): the action commits or rolls back
    with the session. ``outbox`` defaults to :func:`~outbox_core.default_outbox`."""
    connection = session.connection()
    raw = connection.connection.driver_connection
    _check_driver(connection, raw, psycopg.Connection)
    conn: psycopg.Connection[Any] = raw  # type: ignore[assignment]
    return (outbox or default_outbox()).enqueue(conn, request)


async def aenqueue(
    session: AsyncSession, request: ActionRequest, *, outbox: Outbox | None = None
) -> Enqueued:
    """The async twin of :func:`enqueue`, for an ``AsyncSession``."""
    connection = await session.connection()
    raw_connection = await connection.get_raw_connection()
    raw = raw_connection.driver_connection
    _check_driver(connection.sync_connection, raw, psycopg.AsyncConnection)  # type: ignore[arg-type]
    conn: psycopg.AsyncConnection[Any] = raw  # type: ignore[assignment]
    return await (outbox or default_outbox()).aenqueue(conn, request)
