"""Finding a PostgreSQL for tests, the migrated template, and one fresh database per test."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ..adapter import ActionAdapter
from ..executor import Executor
from ..migrations import MigrationLine, migrate, ordered
from ..outbox import Outbox
from ..plugins import PluginHost
from ..registry import KindRegistry
from ..settings import OutboxSettings
from ..states import ActionState
from .draining import TEST_MARK, drain

A = TypeVar("A", bound=type[ActionAdapter])

ENV_URL = "OUTBOX_TEST_DATABASE_URL"
LOCAL_CANDIDATES = (
    "postgresql://postgres@/postgres?host=/var/run/postgresql",
    "postgresql://postgres@127.0.0.1:5432/postgres",
)


# How long a test waits while the server refuses connections for having every slot taken: a
# server shared with other suites is full for a moment, not broken.
SERVER_FULL_WAIT_SECONDS = 60.0


def _server_full(exc: psycopg.OperationalError) -> bool:
    return exc.sqlstate == "53300" or "too many clients already" in str(exc)


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect``, waiting (up to ``SERVER_FULL_WAIT_SECONDS``) while the server says
    it has too many clients."""
    deadline = time.monotonic() + SERVER_FULL_WAIT_SECONDS
    while True:
        try:
            return psycopg.connect(url, **kwargs)
        except psycopg.OperationalError as exc:
            if not _server_full(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.1 + 0.2 * random.random())


async def aconnect(url: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """``connect`` for asyncio."""
    deadline = time.monotonic() + SERVER_FULL_WAIT_SECONDS
    while True:
        try:
            return await psycopg.AsyncConnection.connect(url, **kwargs)
        except psycopg.OperationalError as exc:
            if not _server_full(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1 + 0.2 * random.random())


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def find_server() -> tuple[str, Any]:
    """(a maintenance URL, a handle to stop or None): ``OUTBOX_TEST_DATABASE_URL``, else the
    local server on the socket or 127.0.0.1:5432, else an embedded server."""
    url = os.environ.get(ENV_URL)
    if url:
        if not _answers(url):
            raise RuntimeError(f"{ENV_URL}={url!r} does not answer")
        return url, None
    for candidate in LOCAL_CANDIDATES:
        if _answers(candidate):
            return candidate, None
    from ..embedded import EmbeddedPostgres

    server = EmbeddedPostgres()
    server.start()
    return server.url, server


def with_database(url: str, dbname: str) -> str:
    """The same server and credentials, another database."""
    return make_conninfo(url, dbname=dbname)


def template_name(lines: Sequence[MigrationLine], schema: str) -> str:
    digest = hashlib.sha256(schema.encode())
    digest.update(TEST_MARK.encode())  # a template made before it carried the mark is not used
    for line in ordered(lines):
        for migration in line.files():
            digest.update(f"{migration.label}:{migration.checksum}".encode())
    return f"outbox_tmpl_{digest.hexdigest()[:16]}"


def build_template(admin_url: str, lines: Sequence[MigrationLine], schema: str) -> str:
    """Create (once; concurrent sessions wait on an advisory lock) a database migrated with
    ``lines``; its name changes whenever a migration does."""
    name = template_name(lines, schema)
    with connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('outbox-test-template'))")
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if exists is None:
                building = name + "_build"
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(building)
                    )
                )
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                with connect(with_database(admin_url, building), autocommit=True) as target:
                    migrate(target, schema, lines)
                    # Its clones inherit the mark: drain() runs on them and nowhere else.
                    target.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(TEST_MARK)))
                    target.execute(
                        sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                            sql.Identifier(TEST_MARK),
                            sql.Literal(
                                "made by outbox_core.testing: this database is the test template "
                                "or a clone of it, where drain() may make every action due"
                            ),
                        )
                    )
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext('outbox-test-template'))")
    return name


@dataclass
class OutboxTestDatabase:
    """A fresh database cloned from the migrated template, with an Outbox bound to it.

    Its executors start strictly (``strict_startup``): in a test, a kind whose adapter cannot
    be built fails the test where it opens instead of leaving its actions queued."""

    url: str
    name: str
    schema: str
    host: PluginHost
    registry: KindRegistry = field(default_factory=KindRegistry)
    settings: OutboxSettings = field(default_factory=lambda: OutboxSettings(strict_startup=True))

    @property
    def outbox(self) -> Outbox:
        return Outbox(
            schema=self.schema, registry=self.registry, host=self.host, settings=self.settings
        )

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return connect(self.url, **kwargs)

    async def aconnect(self, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        return await aconnect(self.url, **kwargs)

    def replace_adapter(self, adapter: A, *, distribution: str) -> A:
        """Register ``adapter`` (e.g. a class bound to a loopback server's settings) in place of
        the one registered for its kind, keeping that one's distribution and version
        (``distribution`` when none was registered). Returns ``adapter``."""
        kind = adapter.kind
        current = self.registry.get(kind) if kind in self.registry else None
        self.registry.unregister(kind)
        self.registry.register(
            adapter,
            distribution=current.distribution if current is not None else distribution,
            version=current.version if current is not None else "",
        )
        return adapter

    def register_kind(self, adapter: type[ActionAdapter], *, line: str = "test") -> None:
        """Register a throwaway kind for this test: in the registry and in the database."""
        self.registry.register(adapter, distribution="(test)")
        params = {
            "kind": adapter.kind,
            "at_most_once": adapter.at_most_once,
            "instance_level": adapter.instance_level,
            "line": line,
        }
        with self.connect(autocommit=True) as conn:
            conn.execute(self.outbox.queries["register_kind"], params)

    def configure(self, **values: Any) -> None:
        """Change the settings the outbox and its executors use in this test."""
        self.settings = self.settings.model_copy(update=values)

    def executor(self, **values: Any) -> Executor:
        settings = self.settings.model_copy(update=values) if values else self.settings
        return Executor(self.outbox, self.url, settings=settings)

    async def adrain(self, *, timeout: float = 60.0, **values: Any) -> int:
        async with self.executor(**values) as executor:
            return await executor.drain(timeout=timeout)

    def drain(self, *, timeout: float = 60.0, **values: Any) -> int:
        settings = self.settings.model_copy(update=values)
        outbox = Outbox(
            schema=self.schema, registry=self.registry, host=self.host, settings=settings
        )
        return drain(outbox, self.url, timeout=timeout)

    def execute(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        """Run one statement in autocommit, ``{schema}`` replaced by the schema."""
        with self.connect(autocommit=True) as conn:
            conn.execute(query.replace("{schema}", f'"{self.schema}"'), params)

    def scalar(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> Any:
        """One value, with ``{schema}`` in the query replaced by the schema."""
        with self.connect(autocommit=True) as conn:
            row = conn.execute(query.replace("{schema}", f'"{self.schema}"'), params).fetchone()
        return None if row is None else row[0]

    def rows(
        self, query: str, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with self.connect(autocommit=True) as conn:
            return conn.execute(query.replace("{schema}", f'"{self.schema}"'), params).fetchall()

    def action_state(self, key: str) -> tuple[ActionState, str | None, int] | None:
        """(state, stop reason, attempts counted) of the action holding idempotency key
        ``key``; None when no action holds it (never enqueued, or removed)."""
        rows = self.rows(
            "SELECT state, stop_reason, attempt FROM {schema}.agent_action "
            "WHERE idempotency_key = %s",
            (key,),
        )
        return None if not rows else (ActionState(rows[0][0]), rows[0][1], rows[0][2])

    def contents(self) -> dict[str, list[str]]:
        """Every row of every table of the schema (each row as text, sorted), by table name:
        two of them compare equal when nothing in the schema changed in between."""
        with self.connect(autocommit=True) as conn:
            names = conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY 1",
                (self.schema,),
            ).fetchall()
            return {
                name: [
                    row[0]
                    for row in conn.execute(
                        sql.SQL("SELECT t::text FROM {}.{} t ORDER BY 1").format(
                            sql.Identifier(self.schema), sql.Identifier(name)
                        )
                    )
                ]
                for (name,) in names
            }


@contextmanager
def fresh_database(
    admin_url: str, template: str, prefix: str = "outbox_test"
) -> Iterator[tuple[str, str]]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )
    with connect(admin_url, autocommit=True) as conn:
        # Another session may be connected to the template for a moment (it is being built, or
        # a test opened it): PostgreSQL refuses to copy it then. Try again for a while.
        for attempt in range(50):
            try:
                conn.execute(create)
                break
            except psycopg.errors.ObjectInUse:
                if attempt == 49:
                    raise
                time.sleep(0.1 + 0.1 * random.random())
    try:
        yield with_database(admin_url, name), name
    finally:
        with connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
