"""Which kinds can run with these settings: each kind's adapter is built, and a kind whose
adapter cannot be built (its plugin's settings are invalid, or invalid against the core's,
or its construction raised) is stopped, not every kind.

It also says whether the executor's database connections are sessions of their own
(:func:`acheck_sessions`): it refuses to open through a pooler in transaction mode.

The executor builds the adapters of the kinds it serves when it opens: a stopped kind is
logged (``executor.kind.stopped``), counted by the gauge ``executor.kind.stopped``, and its
actions stay queued for an executor that can run them. With ``OUTBOX_STRICT_STARTUP`` (or
``outbox run --strict``) the executor refuses to open instead. ``outbox status`` builds the
adapters the same way, with the settings it sees, and lists the kinds that cannot run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection
from pydantic import ValidationError

from .adapter import ActionAdapter, check_built
from .errors import ConfigurationError, OutboxError
from .observability import event
from .registry import KindRegistry, RegisteredKind
from .settings import OutboxSettings
from .settings_section import validation_problems


@dataclass(frozen=True, slots=True)
class StoppedKind:
    """A kind whose adapter could not be built, who registered it, and why."""

    kind: str
    distribution: str
    error: str


def build_error(exc: BaseException) -> str:
    """One line about a failed build, without input values (a settings value may be secret)."""
    if isinstance(exc, ValidationError):
        return f"{exc.title}: {validation_problems(exc)}"
    if isinstance(exc, OutboxError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def build_adapters(
    entries: Mapping[str, RegisteredKind], settings: OutboxSettings
) -> tuple[dict[str, ActionAdapter], list[StoppedKind]]:
    """Each kind's adapter, and the kinds whose adapter could not be built."""
    adapters: dict[str, ActionAdapter] = {}
    stopped: list[StoppedKind] = []
    for kind, entry in sorted(entries.items()):
        try:
            adapters[kind] = check_built(entry.adapter, entry.adapter.build(settings))
        except Exception as exc:
            stopped.append(StoppedKind(kind, entry.distribution, build_error(exc)))
    return adapters, stopped


def refusal(stopped: list[StoppedKind], *, strict: bool) -> ConfigurationError:
    """The error of an executor that will not open: strict start-up found kinds that cannot
    run, or (``strict=False``) no kind it serves can run."""
    each = "; ".join(f"{s.kind} (from {s.distribution}): {s.error}" for s in stopped)
    if strict:
        return ConfigurationError(
            f"strict start-up: {len(stopped)} kind(s) cannot run with these settings: {each}. "
            "Fix the settings, or start without OUTBOX_STRICT_STARTUP / --strict to run the "
            "other kinds and leave these queued"
        )
    return ConfigurationError(
        f"no kind this executor serves can run with these settings: {each}. Fix the settings "
        "(`outbox status` lists the kinds that cannot run)"
    )


async def acheck_kinds(registry: KindRegistry, settings: OutboxSettings) -> list[StoppedKind]:
    """The kinds of ``registry`` that an executor with ``settings`` would stop. Builds each
    adapter and closes it again (an adapter opens provider connections only in attempts)."""
    adapters, stopped = build_adapters({entry.kind: entry for entry in registry}, settings)
    for adapter in adapters.values():
        # A check: a failed close of an adapter that ran nothing is not news.
        with contextlib.suppress(Exception):
            await adapter.aclose()
    return stopped


def check_kinds(registry: KindRegistry, settings: OutboxSettings) -> list[StoppedKind]:
    """The sync twin of :func:`acheck_kinds` (run on a thread of its own, so that it also
    works where an event loop is running)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="outbox-check") as pool:
        return pool.submit(asyncio.run, acheck_kinds(registry, settings)).result()


TRANSACTION_POOLED = (
    "{database} is reached through a pooler in transaction mode (two client connections "
    "shared one server session, or one client connection moved between server sessions): "
    "the executor needs a server session per connection (LISTEN, prepared statements, its "
    "listener's pid); point OUTBOX_DATABASE_URL at PostgreSQL itself or at a PgBouncer "
    "database in session mode (pool_mode = session), and keep transaction pooling for the "
    "producers"
)


async def _backend(conn: AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT pg_backend_pid()", prepare=False)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


OPEN_WAIT_SECONDS = 30.0
"""How long an executor that opens waits for its database (its session check, its pool): a
failover or a restart between ``outbox run``'s start-up wait and the open is waited out."""


async def acheck_sessions_waiting(conninfo: str, database: str) -> None:
    """:func:`acheck_sessions`, waiting up to :data:`OPEN_WAIT_SECONDS` for a database that does
    not take connections (``executor.database.waiting``, one line a try), as the pool's open
    waits: an ``outbox run`` started during a failover otherwise died on the check, with a
    traceback (the failover chaos run, issue 35)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OPEN_WAIT_SECONDS
    delay = 0.25
    while True:
        try:
            await acheck_sessions(conninfo, database)
            return
        except psycopg.OperationalError as exc:
            if loop.time() + delay > deadline:
                raise
            event(
                "executor.database.waiting",
                level=logging.WARNING,
                database=database,
                error=type(exc).__name__,
                retry_in=delay,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


async def acheck_sessions(conninfo: str, database: str) -> None:
    """Refuse (:class:`ConfigurationError`, one line) a ``conninfo`` whose connections are not
    server sessions of their own: a pooler in transaction mode (PgBouncer's ``pool_mode =
    transaction``) gives each transaction whichever server connection is free, so the
    executor's LISTEN, its prepared claim and settle statements and the pid that names its
    wake-up row would belong to whoever runs there next.

    Two connections: the first asks its server's pid; the second, in a transaction, asks its
    own (a transaction pooler hands it the session the first just gave back); the first asks
    again while the second holds its session (a transaction pooler must then give it another).
    A direct connection, or a pooler in session mode, keeps each client on its own session."""
    async with (
        await AsyncConnection.connect(conninfo, autocommit=True) as first,
        await AsyncConnection.connect(conninfo, autocommit=True) as second,
    ):
        before = await _backend(first)
        async with second.transaction():
            other = await _backend(second)
            again = await _backend(first)
    if other == before or again != before:
        raise ConfigurationError(TRANSACTION_POOLED.format(database=database))
