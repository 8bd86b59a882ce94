"""How the `outbox` command reaches its database: the configured server (a one-line error,
no traceback, when it cannot be had; `outbox run` waits for one that is starting up) or an
embedded one when none is configured."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
import psycopg

from ..settings import OutboxSettings
from ..settings_section import hide_url
from .guard import EXIT_USAGE, fail


def _unreachable(exc: psycopg.Error, url: str) -> NoReturn:
    if isinstance(exc, psycopg.ProgrammingError):
        fail(f"the database URL is malformed: {hide_url(str(exc), url)}", EXIT_USAGE)
    fail(f"cannot reach the database: {hide_url(_first_line(exc), url)}")


def _first_line(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# What the server says while it cannot take connections yet (SQLSTATE 57P03, which libpq does
# not pass on for a failed connection: only its message).
_NOT_NOW = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "not yet accepting connections",
    "too many clients already",  # 53300: a slot frees when another client leaves
)


def _may_come_back(exc: psycopg.OperationalError) -> bool:
    """A failure to connect that a restarting or failing-over server gives: no answer at all
    (SQLSTATE class 08: refused, reset, timed out) or 57P03 (starting up, shutting down,
    recovering, or full). A refused login or a missing database, which the server answers with
    another FATAL error, will not mend by waiting. libpq passes no SQLSTATE for a failed
    connection, so this reads the server's message: with messages in another language
    (lc_messages), every FATAL error is taken to come back, and the wait runs its course."""
    if exc.sqlstate is not None:
        return exc.sqlstate.startswith("08") or exc.sqlstate in ("57P03", "53300")
    message = str(exc)
    return "FATAL:" not in message or any(text in message for text in _NOT_NOW)


@contextmanager
def connected(
    url: str, *, wait_seconds: float = 0.0, **kwargs: Any
) -> Iterator[psycopg.Connection[Any]]:
    """A connection, with a one-line error (and no traceback) when the server cannot be had.
    With ``wait_seconds``, a server that is unreachable or starting up is tried again, with
    backoff and one line a try, for that long."""
    deadline = time.monotonic() + wait_seconds
    pause = 0.5
    while True:
        try:
            conn = psycopg.connect(url, connect_timeout=10, **kwargs)
            break
        except psycopg.OperationalError as exc:
            left = deadline - time.monotonic()
            if not _may_come_back(exc) or left <= 0:
                _unreachable(exc, url)
            pause = min(pause, left)
            click.echo(
                f"outbox: the database is not answering yet ({hide_url(_first_line(exc), url)}); "
                f"trying again "
                f"in {pause:.1f} s (OUTBOX_STARTUP_WAIT_SECONDS: {left:.0f} s left)",
                err=True,
            )
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
        except psycopg.ProgrammingError as exc:
            _unreachable(exc, url)
    with conn:
        yield conn


@asynccontextmanager
async def aconnected(url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The async twin of :func:`connected`."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=10)
    except (psycopg.ProgrammingError, psycopg.OperationalError) as exc:
        _unreachable(exc, url)
    async with conn:
        yield conn


@contextmanager
def database(
    settings: OutboxSettings,
    data_dir: Path | None,
    *,
    migrate_first: bool = False,
    wait_seconds: float = 0.0,
) -> Iterator[str]:
    """The configured server, or an embedded one (said in one line) migrated on start. A
    configured server that is not migrated is refused in one line (see :func:`check_migrated`),
    unless ``migrate_first``."""
    url = settings.dsn()
    if url is not None:
        if data_dir is not None:
            fail("--data-dir is for the embedded server; a database URL is configured", EXIT_USAGE)
        with connected(url, wait_seconds=wait_seconds, autocommit=True) as conn:
            from ..plugins import load_plugins

            if migrate_first:
                from ..migrations import migrate as apply

                apply(conn, settings.schema_name, load_plugins().migration_lines)
            else:
                check_migrated(conn, settings.schema_name)
        yield url
        return
    from ..embedded import EmbeddedPostgres, EmbeddedUnavailable
    from ..migrations import migrate as apply
    from ..plugins import load_plugins

    server = EmbeddedPostgres(data_dir)
    try:
        server.start()
    except EmbeddedUnavailable as exc:
        fail(
            "no database configured: set OUTBOX_DATABASE_URL (or pass --database-url "
            f"postgresql://user@host:5432/dbname); to try outbox without one, {exc}",
            EXIT_USAGE,
        )
    try:
        click.echo(
            f"outbox: no database configured; using an embedded PostgreSQL in {server.data_dir} "
            "(set OUTBOX_DATABASE_URL in production)",
            err=True,
        )
        with connected(server.url, autocommit=True) as conn:
            apply(conn, settings.schema_name, load_plugins().migration_lines)
        yield server.url
    finally:
        server.stop()


def check_migrated(conn: psycopg.Connection[Any], schema: str) -> None:
    """Refuse, in one line, a database whose schema lacks the core's migrations of this build
    (never migrated, or not since this build was installed): before the executor starts, not
    as a traceback from its first claim. A plugin's pending migrations are a warning: its kinds
    have no rows to claim until they are applied, and the other kinds run."""
    from ..migrations import CORE_LINE, applied, plan
    from ..observability import event
    from ..plugins import load_plugins

    done = applied(conn, schema)
    if not done:
        fail(
            f"the database has no outbox schema {schema!r} (never migrated, or another "
            "OUTBOX_SCHEMA): run `outbox migrate`"
        )
    pending = plan(load_plugins().migration_lines, done)
    core = [migration.label for migration in pending if migration.line == CORE_LINE]
    if core:
        fail(
            f"the schema {schema!r} lacks migrations this build needs ({', '.join(core)}): "
            "run `outbox migrate`"
        )
    others = [migration.label for migration in pending]
    if others:
        import logging

        event(
            "executor.migrations.pending",
            level=logging.WARNING,
            schema=schema,
            pending=",".join(others),
            detail="their kinds have nothing to claim until `outbox migrate` applies them",
        )
