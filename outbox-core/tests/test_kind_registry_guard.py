"""Every action's kind is a registered kind with the same flags, for every writer (migration
0015: checked once per statement, where a foreign key checked every row), an action's kind and
flags never change, and the registry only grows."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

INSERT = (
    'INSERT INTO "{schema}".agent_action (kind, at_most_once, instance_level, lane_key, '
    "idempotency_key, max_attempts) VALUES "
)


@pytest.fixture
def conn(db: OutboxTestDatabase) -> Iterator[psycopg.Connection]:
    with db.connect(autocommit=True) as conn:
        yield conn


def test_a_statement_with_one_unregistered_kind_among_its_rows_writes_none_of_them(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    rows = ", ".join(
        f"('{kind}', false, true, 'l', 'k{n}', 1)"
        for n, kind in enumerate(["TEST_NOOP"] * 50 + ["TEST_NOPE"] + ["TEST_NOOP"] * 49)
    )
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="fk_agent_action_kind.*TEST_NOPE"):
        conn.execute(INSERT.format(schema=db.schema) + rows)
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


def test_the_refusal_names_the_constraint_as_the_foreign_key_did(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
        conn.execute(INSERT.format(schema=db.schema) + "('TEST_NOOP', true, true, 'l', 'k', 1)")
    assert refused.value.diag.constraint_name == "fk_agent_action_kind"
    assert refused.value.diag.table_name == "agent_action"


def test_rows_of_several_registered_kinds_pass_in_one_statement(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    conn.execute(
        INSERT.format(schema=db.schema)
        + "('TEST_NOOP', false, true, 'l', 'a', 1), ('TEST_ONCE', true, true, 'l', 'b', 1)"
    )
    assert db.scalar("SELECT count(*) FROM {schema}.agent_action") == 2


@pytest.mark.parametrize(
    "change", ["at_most_once = NOT at_most_once", "instance_level = false, workspace_id = 'w'"]
)
def test_an_actions_kind_flags_never_change(
    db: OutboxTestDatabase, conn: psycopg.Connection, change: str
) -> None:
    action = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "flags"))
    with pytest.raises(psycopg.errors.CheckViolation, match="flags never change"):
        conn.execute(f'UPDATE "{db.schema}".agent_action SET {change} WHERE id = %s', (action.id,))


def test_an_update_that_names_the_flags_without_changing_them_passes(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    action = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "same"))
    conn.execute(
        f'UPDATE "{db.schema}".agent_action SET at_most_once = at_most_once WHERE id = %s',
        (action.id,),
    )


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM \"{schema}\".action_kind WHERE kind = 'TEST_NOOP'",
        "UPDATE \"{schema}\".action_kind SET at_most_once = true WHERE kind = 'TEST_NOOP'",
        "UPDATE \"{schema}\".action_kind SET kind = 'TEST_RENAMED' WHERE kind = 'TEST_NOOP'",
        'TRUNCATE "{schema}".action_kind',
    ],
)
def test_the_registry_only_grows(
    db: OutboxTestDatabase, conn: psycopg.Connection, statement: str
) -> None:
    with pytest.raises(psycopg.errors.RestrictViolation, match="only ever added"):
        conn.execute(statement.format(schema=db.schema))
    assert db.scalar("SELECT count(*) FROM {schema}.action_kind WHERE kind = 'TEST_NOOP'") == 1


def test_a_kinds_bookkeeping_may_change(db: OutboxTestDatabase, conn: psycopg.Connection) -> None:
    conn.execute(f"UPDATE \"{db.schema}\".action_kind SET line = 'moved' WHERE kind = 'TEST_NOOP'")
    assert db.scalar("SELECT line FROM {schema}.action_kind WHERE kind = 'TEST_NOOP'") == "moved"
