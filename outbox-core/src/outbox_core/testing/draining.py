"""``drain``: run the executor until no action is due (the specification's
``ActionTestSupport.drain``). Its own module, below ``database``, which uses it.

``drain`` makes every waiting action due first (a ``not_before`` tomorrow runs now), which is
what a test wants and never what an application wants: it runs only on a test database, one
that the pytest plugin cloned from its template (the template carries :data:`TEST_MARK`, a
schema that its clones inherit), unless the caller says ``allow_any_database=True``. An
application runs what is due with ``outbox run`` (or ``outbox run --once``)."""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection

from ..errors import OutboxError
from ..executor import Executor
from ..observability import database_label
from ..outbox import Outbox

# The schema that marks the test template and every database cloned from it.
TEST_MARK = "outbox_test_template"


class NotATestDatabase(OutboxError):
    """``drain`` was pointed at a database that the test harness did not make."""


async def refuse_unless_test_database(conninfo: str) -> None:
    """Raise :class:`NotATestDatabase` unless the database carries :data:`TEST_MARK`."""
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", (TEST_MARK,)
        )
        row = await cursor.fetchone()
    if row is None or not row[0]:
        raise NotATestDatabase(
            f"drain() makes every waiting action due (an action whose not_before is tomorrow "
            f"would run now), so it runs only on a test database, one the pytest plugin cloned "
            f"from its template (fixture outbox_db); {database_label(conninfo)} is not one. To "
            "run what is due in an application, use `outbox run --once` (or `outbox run`); to "
            "drain a database your own test setup made, pass allow_any_database=True"
        )


async def adrain(
    outbox: Outbox,
    conninfo: str,
    *,
    timeout: float = 60.0,
    allow_any_database: bool = False,
    **settings: Any,
) -> int:
    """Async :func:`drain`. ``settings`` override the executor's (e.g. ``lease_seconds``)."""
    if not allow_any_database:
        await refuse_unless_test_database(conninfo)
    merged = outbox.settings.model_copy(update=settings) if settings else outbox.settings
    async with Executor(outbox, conninfo, settings=merged) as executor:
        return await executor.drain(timeout=timeout)


def drain(
    outbox: Outbox,
    conninfo: str,
    *,
    timeout: float = 60.0,
    allow_any_database: bool = False,
    **settings: Any,
) -> int:
    """Make every waiting action due and run the executor until no action is due. Returns how
    many attempts and endings ran. From async code, await :func:`adrain` instead.

    Only on a test database (one the pytest plugin cloned from its template), or with
    ``allow_any_database=True``: anywhere else it raises :class:`NotATestDatabase` and changes
    nothing."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(
            adrain(
                outbox,
                conninfo,
                timeout=timeout,
                allow_any_database=allow_any_database,
                **settings,
            )
        )
    raise RuntimeError("drain() was called inside a running event loop; use `await adrain(...)`")
