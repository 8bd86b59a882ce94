"""Migrations: lines, order, checksums, the advisory lock, and the schema the code expects."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox_core import MigrationError, MigrationLine
from outbox_core.action import ACTION_COLUMNS
from outbox_core.migrations import (
    Migration,
    _lock_key,
    applied,
    core_line,
    migrate,
    plan,
    script,
    statements,
)
from outbox_core.sqlfiles import core_queries
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.database import fresh_database, with_database

from .test_concurrency import wait_for

FIXTURE = MigrationLine("fixture", "outbox_core_tests_fixture", "migrations")


@pytest.fixture
def empty_db(outbox_server: str) -> Iterator[str]:
    """A database with nothing in it (cloned from template0)."""
    with fresh_database(outbox_server, "template0", prefix="outbox_empty") as (url, _):
        yield url


@pytest.fixture(autouse=True)
def fixture_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import fixture_plugin

    monkeypatch.setitem(sys.modules, "outbox_core_tests_fixture", fixture_plugin)


def labels(migrations: list[Any]) -> list[str]:
    return [m.label for m in migrations]


# The core line's files as shipped, in order ("core/0001_schema", ...).
CORE = labels(core_line().files())


def test_core_applies_first_then_plugin_lines_and_a_second_run_is_a_no_op(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        first = migrate(conn, "outbox", [FIXTURE])
        assert labels(first) == [*CORE, "fixture/0001_fixture"]
        assert migrate(conn, "outbox", [FIXTURE]) == []
        assert sorted(applied(conn, "outbox")) == [
            *(("core", n) for n in range(1, len(CORE) + 1)),
            ("fixture", 1),
        ]


def test_a_plugin_line_never_applies_before_the_core_line(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        pending = plan([FIXTURE], {})
        assert [m.line for m in pending] == [*(["core"] * len(CORE)), "fixture"]
        # Applied alone, the plugin's file fails on the missing kind registry, and says so.
        fixture_only = FIXTURE.files()[0]
        from outbox_core.migrations import _apply

        with pytest.raises(MigrationError, match="fixture/0001_fixture failed"):
            _apply(conn, "outbox", fixture_only)


def test_two_migrators_at_once_apply_each_file_exactly_once(empty_db: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        try:
            with psycopg.connect(empty_db, autocommit=True) as conn:
                barrier.wait()
                results.append(labels(migrate(conn, "outbox", [FIXTURE])))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(results, key=len) == [
        [],
        [*CORE, "fixture/0001_fixture"],
    ]


def test_a_changed_applied_file_is_refused(empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        migrate(conn, "outbox", [])
        conn.execute(
            "UPDATE outbox.schema_migration SET checksum = 'edited' WHERE line = 'core' AND version = 1"
        )
        with pytest.raises(
            MigrationError, match="core/0001_schema was changed after it was applied"
        ):
            migrate(conn, "outbox", [])


def test_a_line_name_used_twice_names_both_registrants() -> None:
    other = MigrationLine("fixture", "somewhere_else", "migrations", "outbox-other")
    with pytest.raises(
        MigrationError, match="registered twice: by .*outbox_core_tests_fixture.*outbox-other"
    ):
        plan([FIXTURE, other], {})


def test_the_migrated_schema_is_what_the_code_expects(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        migrate(conn, "outbox", [])
        columns = {
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'outbox' AND table_name = 'agent_action'"
            )
        }
        read = {name.strip() for name in ACTION_COLUMNS.split(",")}
        assert read <= columns
        # The kind's flags (copies of the registry's) and the enqueuing span's trace context
        # (read only by the executor while tracing is on: outbox_core/tracing.py).
        assert columns - read == {"at_most_once", "instance_level", "trace_context"}
        indexes = {
            row[0]
            for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'outbox'")
        }
        assert {
            "ux_agent_action_lane_executing",
            "ux_agent_action_idempotency_key",
            "ix_agent_action_lane_id",
        } <= indexes
        # Replaced by ix_agent_action_lane_head (0010), which also holds the proposals; that one
        # and the other indexes that named `state` or `ended_at` dropped by 0021 (issue 34).
        assert (
            not {
                "ix_agent_action_lane_live",
                "ix_agent_action_lane_head",
                "ux_agent_action_lane_executing_old",
                "ix_agent_action_ended",
                "ix_agent_action_expiry",
                "ix_agent_action_uncertain",
            }
            & indexes
        )
        triggers = {
            row[0] for row in conn.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
        }
        assert {"guard_agent_action", "guard_agent_action_insert"} <= triggers
        # Every statement the code runs plans against the migrated schema.
        for name, query in core_queries("outbox").items():
            params = {p: None for p in re.findall(r"%\((\w+)\)[sb]", query)}
            with conn.transaction():
                try:
                    conn.execute("EXPLAIN " + query, params)
                except psycopg.Error as exc:
                    raise AssertionError(f"statement {name} does not plan: {exc}") from exc


def test_migration_11_gives_the_proposals_enqueued_before_it_a_lane_row(empty_db: str) -> None:
    """Before 0011, enqueue gave a proposal no lane row: one alone in its lane had none, and one
    below an admitted action sat under the row's head_id. Migration 11 is applied again over a
    database left that way (its tracking row removed)."""
    with psycopg.connect(empty_db, autocommit=True) as conn:
        migrate(conn, "outbox", [])
        conn.execute(
            "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
            "VALUES ('TEST_OLD', false, true, 'test')"
        )
        insert = (
            "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
            "idempotency_key, payload, state, max_attempts) "
            "VALUES ('TEST_OLD', false, true, %s, %s, '{}', %s, 1) RETURNING id"
        )

        def action(lane: str, key: str, state: str) -> int:
            return conn.execute(insert, (lane, key, state)).fetchone()[0]  # type: ignore[index]

        alone = action("alone", "p-alone", "PROPOSED")
        below = action("behind", "p-below", "PROPOSED")
        above = action("behind", "a-above", "ADMITTED")
        conn.execute(
            "INSERT INTO outbox.action_lane VALUES ('behind', now() + interval '1 hour', %s, "
            "'TEST_OLD')",
            (above,),
        )
        conn.execute("DELETE FROM outbox.schema_migration WHERE line = 'core' AND version = 11")
        assert labels(migrate(conn, "outbox", [])) == ["core/0011_proposals_hold_lanes"]
        lanes = conn.execute(
            "SELECT lane_key, head_id, next_at <= now(), head_kind FROM outbox.action_lane "
            "ORDER BY lane_key"
        ).fetchall()
    assert lanes == [("alone", alone, True, None), ("behind", below, True, None)]


def test_the_printed_script_applied_by_psql_is_what_migrate_would_have_done(
    outbox_server: str, empty_db: str
) -> None:
    text = script("outbox", plan([FIXTURE], {}))
    assert 'INSERT INTO "outbox".schema_migration' in text
    completed = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-q", empty_db],
        input=text,
        text=True,
        capture_output=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert migrate(conn, "outbox", [FIXTURE]) == []
        assert conn.execute(
            "SELECT count(*) FROM outbox.action_kind WHERE kind = 'FIXTURE_KIND'"
        ).fetchone() == (1,)


def test_another_schema_name_holds_its_own_copy(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        migrate(conn, "jobs_two", [])
        assert conn.execute(
            "SELECT to_regclass('jobs_two.agent_action') IS NOT NULL"
        ).fetchone() == (True,)
        assert conn.execute("SELECT to_regclass('outbox.agent_action')").fetchone() == (None,)


def test_migration_files_are_numbered_without_gaps() -> None:
    versions = [m.version for m in core_line().files()]
    assert versions == list(range(1, len(versions) + 1))


def test_with_database_keeps_the_server(outbox_server: str) -> None:
    assert "dbname=x" in with_database(outbox_server, "x")


@pytest.fixture
def notx_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A migration line in a package made for the test: returns its migrations folder."""
    package = tmp_path / "outbox_notx_fixture"
    (package / "migrations").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package / "migrations"
    sys.modules.pop("outbox_notx_fixture", None)


NOTX = MigrationLine("notx", "outbox_notx_fixture", "migrations")
BUILD_PROBE = """-- outbox: no transaction
-- A probe index, built as a plugin would build one on a busy table.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.ix_probe;

CREATE INDEX CONCURRENTLY ix_probe ON {schema}.action_kind (registered_at);
"""


def test_a_no_transaction_file_runs_its_statements_outside_a_transaction(
    empty_db: str, notx_line: Path
) -> None:
    # CREATE INDEX CONCURRENTLY refuses to run inside a transaction block: this file applies
    # only if its statements run one by one, outside one.
    (notx_line / "0001_probe.sql").write_text(BUILD_PROBE)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert labels(migrate(conn, "outbox", [NOTX]))[-1] == "notx/0001_probe"
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox.ix_probe'::regclass"
        ).fetchone() == (True,)
        assert migrate(conn, "outbox", [NOTX]) == []


def test_a_no_transaction_file_that_fails_part_way_runs_again_from_the_top(
    empty_db: str, notx_line: Path
) -> None:
    (notx_line / "0001_probe.sql").write_text(BUILD_PROBE + "\nSELECT 1 / 0;\n")
    with psycopg.connect(empty_db, autocommit=True) as conn:
        with pytest.raises(MigrationError, match="notx/0001_probe failed: division by zero"):
            migrate(conn, "outbox", [NOTX])
        # The statements before the failure stay (no transaction rolled them back); the file
        # is not recorded, so the next run starts it again.
        assert conn.execute("SELECT to_regclass('outbox.ix_probe') IS NOT NULL").fetchone() == (
            True,
        )
        assert ("notx", 1) not in applied(conn, "outbox")
        (notx_line / "0001_probe.sql").write_text(BUILD_PROBE)
        assert labels(migrate(conn, "outbox", [NOTX])) == ["notx/0001_probe"]
        assert ("notx", 1) in applied(conn, "outbox")


def test_the_printed_script_runs_a_no_transaction_file_without_begin(notx_line: Path) -> None:
    (notx_line / "0001_probe.sql").write_text(BUILD_PROBE)
    text = script("outbox", [m for m in plan([NOTX], {}) if m.line == "notx"])
    probe = text[text.index("-- notx/0001_probe") :]
    assert "BEGIN;" not in probe and "COMMIT;" not in probe
    assert probe.index("CREATE INDEX CONCURRENTLY") < probe.index("INSERT INTO")


def test_the_uncertain_count_reads_only_uncertain_actions(empty_db: str) -> None:
    """The gauge reads action_failure's UNCERTAIN rows (migration 20), never the ended
    actions that retention keeps for 30 days."""
    with psycopg.connect(empty_db, autocommit=True) as conn:
        migrate(conn, "outbox", [])
        conn.execute(
            "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
            "VALUES ('PROBE', false, true, 'test')"
        )
        # Ended actions, as retention keeps them for 30 days; one in a thousand UNCERTAIN,
        # each claimed and ended as an executor would (the triggers keep action_failure).
        conn.execute(
            "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
            "idempotency_key, max_attempts) "
            "SELECT 'PROBE', false, true, 'lane-' || g, 'key-' || g, 5 "
            "FROM generate_series(1, 50000) g"
        )
        conn.execute(
            "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, "
            "lease_until = now() + interval '1 minute'"
        )
        conn.execute(
            "UPDATE outbox.agent_action SET state = CASE WHEN id % 1000 = 0 THEN 'UNCERTAIN' "
            "ELSE 'DONE' END, stop_reason = 'TEST', payload = NULL, ended_at = now()"
        )
        conn.execute("VACUUM ANALYZE outbox.agent_action")
        conn.execute("VACUUM ANALYZE outbox.action_failure")
        query = core_queries("outbox")["uncertain_counts"]
        plan_text = "\n".join(
            row[0] for row in conn.execute("EXPLAIN " + query, {"kinds": ["PROBE"]})
        )
        assert "agent_action" not in plan_text, plan_text
        assert conn.execute(query, {"kinds": ["PROBE"]}).fetchall() == [("PROBE", 50)]


def test_a_no_transaction_file_splits_after_each_statement_and_its_comment() -> None:
    text = (
        "\ufeff-- outbox: no transaction\n"
        "DROP INDEX CONCURRENTLY IF EXISTS x; -- the leftover of a failed build\n"
        "-- only a comment here;\n"
        "CREATE INDEX CONCURRENTLY x\n    ON t (a);\n"
        "SELECT 1"
    )
    assert statements(text) == [
        "-- outbox: no transaction\nDROP INDEX CONCURRENTLY IF EXISTS x;",
        "CREATE INDEX CONCURRENTLY x\n    ON t (a);",
        "SELECT 1;",
    ]
    assert not Migration("l", 1, "m", text).transactional
    assert not Migration("l", 1, "m", "--outbox:  no transaction  \nSELECT 1;").transactional
    assert Migration("l", 1, "m", "SELECT 1; -- outbox: no transaction\n").transactional


def test_concurrently_in_a_transactional_file_is_refused_with_the_way_out(notx_line: Path) -> None:
    (notx_line / "0001_probe.sql").write_text(
        BUILD_PROBE.replace("-- outbox: no transaction\n", "")
    )
    with pytest.raises(
        MigrationError,
        match="notx/0001_probe: CONCURRENTLY cannot run inside a transaction; start the file "
        "with the line '-- outbox: no transaction'",
    ):
        NOTX.files()


def test_a_waiting_migrator_says_who_holds_the_lock(
    empty_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(empty_db, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (_lock_key("outbox"),))
        holder_pid = holder.info.backend_pid
        done = threading.Event()

        def run() -> None:
            with psycopg.connect(empty_db, autocommit=True) as conn:
                migrate(conn, "outbox", [])
            done.set()

        def waiting() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("migrate.waiting")]

        with caplog.at_level(logging.WARNING, logger="outbox"):
            thread = threading.Thread(target=run)
            thread.start()
            wait_for(waiting, 60, "the migrator to log migrate.waiting")
            assert not done.is_set()
            holder.execute("SELECT pg_advisory_unlock(%s)", (_lock_key("outbox"),))
            thread.join(60)
        assert done.is_set()
        assert len(waiting()) == 1
        assert f"holder={holder_pid}" in waiting()[0].getMessage()


def test_migrate_refuses_a_connection_inside_a_transaction(empty_db: str) -> None:
    refused = pytest.raises(MigrationError, match="autocommit mode, outside a transaction")
    with psycopg.connect(empty_db, autocommit=True) as conn, conn.transaction(), refused:
        migrate(conn, "outbox", [])
    with psycopg.connect(empty_db) as conn, refused:
        migrate(conn, "outbox", [])


def test_a_no_transaction_file_with_a_dollar_quoted_body_is_refused(notx_line: Path) -> None:
    (notx_line / "0001_probe.sql").write_text(
        BUILD_PROBE + "CREATE FUNCTION {schema}.f() RETURNS int LANGUAGE sql AS $fn$\n"
        "    SELECT 1;\n$fn$;\n"
    )
    with pytest.raises(MigrationError, match="cannot hold a dollar-quoted body"):
        NOTX.files()


def test_migration_11_takes_its_locks_in_the_enqueues_order_and_deadlocks_with_none(
    outbox_db: OutboxTestDatabase,
) -> None:
    """0011 locks lane rows (its backfill) and then needs the action table alone (DROP
    TRIGGER); an enqueue holds the table and then wants a lane row. Taken in that order the two
    deadlocked and PostgreSQL aborted the enqueue; the file now takes the table first."""
    from outbox_core.sqlfiles import render

    migration = next(m for m in core_line().files() if m.version == 11)
    text = render(migration.text, outbox_db.schema)
    first, rest = text.split("CREATE OR REPLACE FUNCTION", 1)
    outbox_db.execute(
        "INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line) "
        "VALUES ('TEST_LOCKS', false, true, 'test')"
    )
    insert = (
        "INSERT INTO {schema}.agent_action (kind, at_most_once, instance_level, lane_key, "
        "idempotency_key, payload, state, max_attempts) "
        "VALUES ('TEST_LOCKS', false, true, 'L', %s, '{}', %s, 3)"
    )
    outbox_db.execute(insert, ("p1", "PROPOSED"))
    errors: list[BaseException] = []
    with outbox_db.connect() as migrator, outbox_db.connect() as producer:
        migrator.execute(first)  # the backfill: lane L's row locked

        def enqueue() -> None:
            try:
                producer.execute(
                    insert.replace("{schema}", f'"{outbox_db.schema}"'), ("a1", "ADMITTED")
                )
                producer.execute(
                    f'INSERT INTO "{outbox_db.schema}".action_lane AS l (lane_key, next_at, head_id) '
                    "VALUES ('L', now(), 99) ON CONFLICT (lane_key) DO UPDATE "
                    "SET next_at = LEAST(l.next_at, excluded.next_at)"
                )
                producer.commit()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=enqueue)
        thread.start()
        thread.join(0.5)  # the producer now waits for a lock the migrator holds
        migrator.execute("CREATE OR REPLACE FUNCTION" + rest)
        migrator.commit()
        thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert outbox_db.scalar("SELECT count(*) FROM {schema}.agent_action") == 2
