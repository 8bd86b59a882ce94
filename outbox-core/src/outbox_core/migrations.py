"""Migrations in lines: one line per package, numbered ``.sql`` files inside the package.

Applied versions are tracked in ``<schema>.schema_migration`` keyed by (line, version) with a
checksum. ``core`` always goes first. A PostgreSQL advisory lock serialises migrators, so two
replicas that start at once apply each file exactly once. Each file runs in its own
transaction together with its tracking row, except a file whose first line is
``-- outbox: no transaction``: its statements run one by one outside a transaction, for
``CREATE INDEX CONCURRENTLY``, which must not block the table's writers while it builds. Such a
file is split where a line ends with ``;`` (a comment may follow it), so it holds no
dollar-quoted bodies or literals that span lines. Its tracking row is written after the last
statement, so a file that fails part way runs again from the top: write it so that it can
(``DROP INDEX CONCURRENTLY IF EXISTS`` before the ``CREATE``, which also removes an invalid
index that a failed build left behind).

The core line's files are history; ``sql/schema.sql`` states what they build, object by object,
for readers. Every new core migration updates it (tests/test_schema_sql.py compares the two).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from .errors import MigrationError
from .observability import event
from .sqlfiles import quote_schema, render

# What PostgreSQL answers when a schema, table, column, function or type that a migration
# creates is not there: the database was never migrated (or not with this schema name), or not
# since this build was installed.
MISSING_OBJECT = (
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
)

CORE_LINE = "core"
# The first line of a file that runs outside a transaction (a BOM and spacing forgiven).
_NO_TRANSACTION = re.compile(
    r"\A\ufeff?[ \t]*--[ \t]*outbox:[ \t]*no[ \t]+transaction[ \t]*$", re.M
)
_CONCURRENTLY = re.compile(r"\bconcurrently\b", re.I)
_COMMENT = re.compile(r"--[^\n]*")
_DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")
_LOCK_POLL_SECONDS = 0.2
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LINE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")


@dataclass(frozen=True, slots=True)
class MigrationLine:
    """A package's migrations: the ``.sql`` files in ``package``/``directory``."""

    name: str
    package: str
    directory: str = "migrations"
    distribution: str = "(application)"

    def __post_init__(self) -> None:
        if not _LINE_NAME.match(self.name):
            raise MigrationError(
                f"migration line {self.name!r}: use a short lower-case name such as 'email'"
            )

    def files(self) -> list[Migration]:
        folder = resources.files(self.package).joinpath(self.directory)
        found: list[Migration] = []
        for entry in folder.iterdir():
            if not entry.name.endswith(".sql"):
                continue
            match = _FILE.match(entry.name)
            if match is None:
                raise MigrationError(
                    f"{self.package}/{self.directory}/{entry.name}: migration files are named "
                    "NNNN_name.sql (four digits, lower-case name)"
                )
            text = entry.read_text("utf-8")
            migration = Migration(self.name, int(match.group(1)), match.group(2), text)
            code = _COMMENT.sub("", text)
            if migration.transactional and _CONCURRENTLY.search(code):
                raise MigrationError(
                    f"{migration.label}: CONCURRENTLY cannot run inside a transaction; start "
                    "the file with the line '-- outbox: no transaction'"
                )
            if not migration.transactional and _DOLLAR_QUOTE.search(code):
                raise MigrationError(
                    f"{migration.label}: a no-transaction file is split at each ';' that ends "
                    "a line, so it cannot hold a dollar-quoted body; put functions in a "
                    "file of their own, without the marker"
                )
            found.append(migration)
        found.sort(key=lambda migration: migration.version)
        versions = [migration.version for migration in found]
        if versions != list(range(1, len(found) + 1)):
            raise MigrationError(
                f"migration line {self.name}: versions must run 1, 2, 3 ... without gaps; "
                f"found {versions}"
            )
        return found


@dataclass(frozen=True, slots=True)
class Migration:
    line: str
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.line}/{self.version:04d}_{self.name}"

    @property
    def transactional(self) -> bool:
        return _NO_TRANSACTION.match(self.text) is None


def statements(text: str) -> list[str]:
    """A no-transaction file's statements: split where a line ends with ``;`` (or with ``;``
    and a comment), without the parts that hold only comments."""
    parts = re.split(r";[ \t]*(?:--[^\n]*)?(?:\n|$)", text.lstrip("\ufeff"))
    return [part.strip() + ";" for part in parts if _COMMENT.sub("", part).strip()]


@dataclass(frozen=True, slots=True)
class AppliedMigration:
    line: str
    version: int
    name: str
    checksum: str


def core_line() -> MigrationLine:
    return MigrationLine(CORE_LINE, "outbox_core", "sql/migrations/core", "outbox-core")


def ordered(lines: Iterable[MigrationLine]) -> list[MigrationLine]:
    """Core first, then the others by name; a line name used twice is an error."""
    by_name: dict[str, MigrationLine] = {}
    for line in lines:
        other = by_name.get(line.name)
        if other is not None and other != line:
            raise MigrationError(
                f"migration line {line.name!r} is registered twice: by {other.distribution} "
                f"({other.package}) and by {line.distribution} ({line.package})"
            )
        by_name[line.name] = line
    by_name.setdefault(CORE_LINE, core_line())
    rest = sorted(name for name in by_name if name != CORE_LINE)
    return [by_name[CORE_LINE], *(by_name[name] for name in rest)]


def _create_schema(schema: str) -> str:
    return f"CREATE SCHEMA IF NOT EXISTS {quote_schema(schema)};"


def _tracking_ddl(schema: str, *, create_schema: bool = True) -> str:
    quoted = quote_schema(schema)
    return (
        (_create_schema(schema) + "\n" if create_schema else "")
        + f"CREATE TABLE IF NOT EXISTS {quoted}.schema_migration (\n"
        "    line text NOT NULL,\n"
        "    version integer NOT NULL,\n"
        "    name text NOT NULL,\n"
        "    checksum text NOT NULL,\n"
        "    applied_at timestamptz NOT NULL DEFAULT now(),\n"
        "    PRIMARY KEY (line, version)\n"
        ");"
    )


def _lock_key(schema: str) -> int:
    digest = hashlib.sha256(f"outbox.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def applied(conn: psycopg.Connection[Any], schema: str) -> dict[tuple[str, int], AppliedMigration]:
    """What the database says it has applied ({} when outbox was never migrated there)."""
    row = conn.execute(
        "SELECT to_regclass(%s)", (f"{quote_schema(schema)}.schema_migration",)
    ).fetchone()
    if row is None or row[0] is None:
        return {}
    query = sql.SQL("SELECT line, version, name, checksum FROM {}.schema_migration").format(
        sql.Identifier(schema)
    )
    return {
        (line, version): AppliedMigration(line, version, name, checksum)
        for line, version, name, checksum in conn.execute(query)
    }


def plan(
    lines: Sequence[MigrationLine], done: dict[tuple[str, int], AppliedMigration]
) -> list[Migration]:
    """The migrations still to apply, in order. A changed applied file is an error."""
    pending: list[Migration] = []
    for line in ordered(lines):
        for migration in line.files():
            was = done.get((migration.line, migration.version))
            if was is None:
                pending.append(migration)
            elif was.checksum != migration.checksum:
                raise MigrationError(
                    f"{migration.label} was changed after it was applied (checksum "
                    f"{was.checksum[:12]} in the database, {migration.checksum[:12]} here); "
                    "ship the change as a new numbered file instead"
                )
    return pending


def migrate(
    conn: psycopg.Connection[Any], schema: str, lines: Sequence[MigrationLine]
) -> list[Migration]:
    """Apply what is pending, under the schema's advisory lock. Returns what was applied.

    ``conn`` must be in autocommit mode, outside a transaction; it is used for the lock and for
    each file (in a transaction of its own, or statement by statement for a no-transaction
    file). A line other than ``core`` never applies before every core file is in.
    """
    if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise MigrationError(
            "migrate() needs a connection in autocommit mode, outside a transaction"
        )
    key = _lock_key(schema)
    # Wait for the lock between statements, not inside one: a migrator blocked in
    # pg_advisory_lock() holds a snapshot, and CREATE INDEX CONCURRENTLY in the lock holder's
    # file waits for every older snapshot, which made the two deadlock.
    waited = False
    while not _try_lock(conn, key):
        if not waited:
            waited = True
            event(
                "migrate.waiting",
                level=logging.WARNING,
                schema=schema,
                holder=_lock_holder(conn, key),
            )
        time.sleep(_LOCK_POLL_SECONDS)
    try:
        exists = _schema_exists(conn, schema)
        if not exists and not _may_create_schemas(conn):
            raise MigrationError(
                f"schema {schema!r} does not exist and role {conn.info.user!r} may not create "
                f"schemas in database {conn.info.dbname!r}: create it for this role first "
                f"(CREATE SCHEMA {quote_schema(schema)} AUTHORIZATION {conn.info.user}), or "
                "migrate as a role with CREATE on the database"
            )
        conn.execute(_tracking_ddl(schema, create_schema=not exists))
        pending = plan(lines, applied(conn, schema))
        core_files = {m.version for m in core_line().files()}
        for migration in pending:
            if migration.line != CORE_LINE:
                have = {v for (line, v) in applied(conn, schema) if line == CORE_LINE}
                if not core_files <= have:
                    raise MigrationError(f"{migration.label} needs the core line applied first")
            _apply(conn, schema, migration)
        return pending
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _schema_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    row = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (quote_schema(schema),)).fetchone()
    return row is not None and bool(row[0])


def _may_create_schemas(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT has_database_privilege(current_user, current_database(), 'CREATE')"
    ).fetchone()
    return row is not None and bool(row[0])


def _try_lock(conn: psycopg.Connection[Any], key: int) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    return row is not None and bool(row[0])


def _lock_holder(conn: psycopg.Connection[Any], key: int) -> int | None:
    """The backend pid that holds the migration lock (None: released meanwhile)."""
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
    ).fetchone()
    return None if row is None else int(row[0])


def _apply(conn: psycopg.Connection[Any], schema: str, migration: Migration) -> None:
    track = sql.SQL(
        "INSERT INTO {}.schema_migration (line, version, name, checksum) VALUES (%s, %s, %s, %s)"
    ).format(sql.Identifier(schema))
    row = (migration.line, migration.version, migration.name, migration.checksum)
    text = render(migration.text, schema)
    if _schema_exists(conn, schema):
        # PostgreSQL checks CREATE on the database before it looks whether the schema exists,
        # so this statement fails for a role that owns a schema made for it but may not make
        # schemas (the least-privilege set-up in docs/operations.md). The file, and so its
        # checksum, stays as applied everywhere else; only the statement is skipped.
        text = text.replace(_create_schema(schema), "")
    try:
        if migration.transactional:
            with conn.transaction():
                conn.execute(text.encode("utf-8"))
                conn.execute(track, row)
            return
        for statement in statements(text):
            conn.execute(statement.encode("utf-8"))
        conn.execute(track, row)
    except psycopg.Error as exc:
        raise MigrationError(f"{migration.label} failed: {exc}") from exc


def script(schema: str, migrations: Sequence[Migration]) -> str:
    """The SQL of ``migrations`` for teams that apply it with their own tool: each file in a
    transaction with the row that tells ``outbox migrate`` it is applied (a no-transaction file
    without one, its row after it)."""
    quoted = quote_schema(schema)
    if not migrations:
        return f"-- outbox: nothing to apply; schema {quoted} is up to date\n"
    parts = [
        "-- outbox migrations for schema " + quoted,
        "SELECT pg_advisory_lock(" + str(_lock_key(schema)) + ");",
        _tracking_ddl(schema),
    ]
    for migration in migrations:
        track = (
            f"INSERT INTO {quoted}.schema_migration (line, version, name, checksum) VALUES "
            f"('{migration.line}', {migration.version}, '{migration.name}', "
            f"'{migration.checksum}');"
        )
        body = render(migration.text, schema).strip()
        if migration.transactional:
            parts += [f"\n-- {migration.label}\nBEGIN;", body, track + "\nCOMMIT;"]
        else:
            header = f"\n-- {migration.label} (outside a transaction: run it as it is)"
            parts += [header, body, track]
    parts.append("SELECT pg_advisory_unlock(" + str(_lock_key(schema)) + ");")
    return "\n".join(parts) + "\n"
