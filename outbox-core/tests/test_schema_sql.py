"""sql/schema.sql, the readable current schema, against what the migrations build.

Two databases, one migrated (the core line) and one built from schema.sql, are described
from their catalogs object by object and compared: a migration that changes an object and a
schema.sql that does not follow fails here, with a diff.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outbox_core.migrations import core_line, migrate
from outbox_core.sqlfiles import render
from outbox_core.testing.database import fresh_database

SCHEMA_SQL = "outbox-core/src/outbox_core/sql/schema.sql"
_DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$")


def schema_sql(schema: str) -> str:
    text = resources.files("outbox_core").joinpath("sql/schema.sql").read_text("utf-8")
    return render(text, schema)


def code_lines(source: str) -> list[str]:
    """A function body's lines without its comments (``--`` and ``/* */`` outside literals),
    each stripped, the empty ones dropped: schema.sql may comment a body for readers, but its
    code is the migrations' code, line for line."""
    kept: list[str] = []
    at, end = 0, len(source)
    while at < end:
        if source.startswith("--", at):
            newline = source.find("\n", at)
            at = end if newline < 0 else newline
        elif source.startswith("/*", at):
            close = source.find("*/", at + 2)
            at = end if close < 0 else close + 2
            kept.append(" ")
        elif source[at] in "'\"":
            quote, stop = source[at], at + 1
            while stop < end:
                if source[stop] == quote:
                    if source.startswith(quote * 2, stop):
                        stop += 2
                        continue
                    break
                stop += 1
            kept.append(source[at : stop + 1])
            at = stop + 1
        elif (tag := _DOLLAR_QUOTE.match(source, at)) is not None:
            close = source.find(tag.group(0), tag.end())
            stop = end if close < 0 else close + len(tag.group(0))
            kept.append(source[at:stop])
            at = stop
        else:
            kept.append(source[at])
            at += 1
    return [line.strip() for line in "".join(kept).splitlines() if line.strip()]


def describe(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The schema's objects as lines of text, sorted by object, from the catalogs."""
    row = conn.execute(
        "SELECT oid, nspacl::text, obj_description(oid, 'pg_namespace') "
        "FROM pg_namespace WHERE nspname = %s",
        (schema,),
    ).fetchone()
    assert row is not None, f"no schema {schema}"
    ns = row[0]
    out = [f"schema {schema} acl={row[1]} comment={row[2]}"]

    def add(title: str, query: str, *params: Any) -> None:
        for values in conn.execute(query, (ns, *params)):
            out.append(title + " " + " | ".join("" if v is None else str(v) for v in values))

    add(
        "relation",
        "SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text, c.relacl::text, "
        "c.relrowsecurity FROM pg_class c WHERE c.relnamespace = %s ORDER BY c.relname",
    )
    add(
        "column",
        "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), "
        "a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, "
        "co.collname "
        "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
        "LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum "
        "LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 "
        "WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f') "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY c.relname, a.attnum",
    )
    add(
        "constraint",
        "SELECT coalesce(c.conrelid::regclass::text, c.contypid::regtype::text), c.conname, "
        "c.contype, pg_get_constraintdef(c.oid), c.condeferrable, c.condeferred "
        "FROM pg_constraint c WHERE c.connamespace = %s ORDER BY 1, 2",
    )
    add(
        "index",
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), i.indisvalid, "
        "i.indisclustered FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relnamespace = %s ORDER BY 1",
    )
    add(
        "sequence",
        "SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, "
        "s.seqmin, s.seqmax, s.seqcache, s.seqcycle FROM pg_sequence s "
        "JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = %s ORDER BY 1",
    )
    add(
        "trigger",
        "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t "
        "JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = %s AND NOT t.tgisinternal "
        "ORDER BY c.relname, t.tgname",
    )
    add(
        "type",
        "SELECT t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull, "
        "t.typdefault, (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) "
        "FROM pg_enum e WHERE e.enumtypid = t.oid), t.typacl::text "
        "FROM pg_type t WHERE t.typnamespace = %s ORDER BY t.typname",
    )
    add(
        "policy",
        "SELECT c.relname, p.polname, p.polcmd, p.polpermissive, "
        "pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid) "
        "FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid "
        "WHERE c.relnamespace = %s ORDER BY 1, 2",
    )
    add(
        "view",
        "SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c "
        "WHERE c.relnamespace = %s AND c.relkind IN ('v', 'm') ORDER BY 1",
    )
    add(
        "comment",
        "SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description "
        "FROM pg_description d, LATERAL pg_identify_object(d.classoid, d.objoid, d.objsubid) o "
        "WHERE o.schema = (SELECT nspname FROM pg_namespace WHERE oid = %s) ORDER BY 1",
    )
    add(
        "extension",
        "SELECT extname, extversion FROM pg_extension WHERE extnamespace = %s ORDER BY 1",
    )
    functions = conn.execute(
        "SELECT p.oid::regprocedure::text, p.prokind, p.prosrc, p.proacl::text, "
        "CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid) END "
        "FROM pg_proc p WHERE p.pronamespace = %s ORDER BY 1",
        (ns,),
    ).fetchall()
    for name, kind, source, acl, definition in functions:
        out.append(f"function {name} kind={kind} acl={acl}")
        # The generated header (arguments, result, language, volatility, SET options); the
        # body is compared as code lines.
        header = (definition or "").replace(source, "<body>")
        out += [f"function {name} header {line}" for line in header.splitlines()]
        out += [f"function {name} body {line}" for line in code_lines(source)]
    # What the migrations insert (the kind registry's rows, any other table's): the tracking
    # table's rows are migrate's, not the schema's.
    tables = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = %s AND relkind = 'r' "
        "AND relname <> 'schema_migration' ORDER BY 1",
        (ns,),
    ).fetchall()
    for (table,) in tables:
        rows = conn.execute(
            sql.SQL("SELECT to_jsonb(t)::text FROM {}.{} t ORDER BY 1").format(
                sql.Identifier(schema), sql.Identifier(table)
            )
        ).fetchall()
        out += [f"row {table} {value}" for (value,) in rows]
    return out


@contextmanager
def empty_database(server: str) -> Iterator[str]:
    with fresh_database(server, "template0", prefix="outbox_schema_sql") as (url, _):
        yield url


@pytest.mark.parametrize("schema", ["outbox", "outbox_readers"])
def test_schema_sql_builds_what_the_migrations_build(outbox_server: str, schema: str) -> None:
    with empty_database(outbox_server) as migrated, empty_database(outbox_server) as written:
        with psycopg.connect(migrated, autocommit=True) as conn:
            migrate(conn, schema, [core_line()])
            expected = describe(conn, schema)
        with psycopg.connect(written, autocommit=True) as conn:
            with conn.transaction():
                conn.execute(schema_sql(schema).encode("utf-8"))
            found = describe(conn, schema)
    if found != expected:
        diff = difflib.unified_diff(
            expected,
            found,
            fromfile="built by the migrations",
            tofile="built from schema.sql",
            lineterm="",
            n=2,
        )
        pytest.fail(
            f"{SCHEMA_SQL} differs from what the migrations build (schema {schema}): "
            "update schema.sql so that it states each object as the migrations leave it "
            "(its header says how)\n" + "\n".join(diff),
            pytrace=False,
        )


def test_code_lines_keep_literals_and_drop_comments() -> None:
    body = (
        "BEGIN -- a comment\n"
        "    RAISE EXCEPTION 'a -- literal, it''s kept'; /* gone */\n"
        "\n"
        "    EXECUTE $q$ SELECT 1 -- kept inside a dollar quote $q$;\n"
        "END"
    )
    assert code_lines(body) == [
        "BEGIN",
        "RAISE EXCEPTION 'a -- literal, it''s kept';",
        "EXECUTE $q$ SELECT 1 -- kept inside a dollar quote $q$;",
        "END",
    ]
