"""The least-privilege recipe of docs/operations.md, run with real roles: the owner of a schema
made for it migrates without CREATE on the database, the worker runs the executor, the
application's role enqueues, and neither can do what it should not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox_core import ActionRequest, ActionState, KindRegistry, Outbox
from outbox_core.migrations import MigrationLine, core_line, migrate
from outbox_core.testing.database import with_database

from .kinds import NoopAdapter

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
FIXTURE_LINE = MigrationLine("fixture", "tests.fixture_plugin", "migrations", "(test)")


def recipe_blocks() -> list[str]:
    """The SQL blocks of the section "The database role", in order."""
    text = OPERATIONS.read_text("utf-8")
    section = text.split("## The database role", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


class Roles:
    def __init__(self, admin_url: str) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.names = {
            "outbox_owner": f"t_owner_{suffix}",
            "outbox_worker": f"t_worker_{suffix}",
            "outbox_app": f"t_app_{suffix}",
        }
        self.dbname = f"outbox_roles_{suffix}"
        self.admin_url = admin_url
        self.admin_db_url = with_database(admin_url, self.dbname)

    def rendered(self, block: str) -> str:
        for doc_name, name in self.names.items():
            block = re.sub(rf"\b{doc_name}\b", name, block)
        return block.replace("PASSWORD '...'", "")

    def url(self, role: str) -> str:
        params = conninfo_to_dict(self.admin_db_url)
        params.pop("password", None)
        return make_conninfo(**{**params, "user": self.names[role]})


@pytest.fixture
def roles(outbox_server: str) -> Iterator[Roles]:
    made = Roles(outbox_server)
    with psycopg.connect(outbox_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(made.dbname)))
    try:
        yield made
    finally:
        with psycopg.connect(outbox_server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(made.dbname)
                )
            )
            for name in made.names.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def outbox_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUTBOX_DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_documented_roles_migrate_run_and_enqueue_with_only_their_rights(
    roles: Roles,
) -> None:
    before_migrate, after_migrate = recipe_blocks()
    with psycopg.connect(roles.admin_db_url, autocommit=True) as admin:
        admin.execute(roles.rendered(before_migrate))
        admin.execute("CREATE SCHEMA elsewhere")
        admin.execute("CREATE TABLE elsewhere.secret (v text)")
        assert admin.execute(
            "SELECT has_database_privilege(%s, current_database(), 'CREATE')",
            (roles.names["outbox_owner"],),
        ).fetchone() == (False,)

    # The owner migrates the schema made for it, twice (the second time nothing is pending).
    first = outbox_cli("migrate", url=roles.url("outbox_owner"))
    assert first.returncode == 0, first.stderr
    assert "applied core/0001" in first.stdout
    again = outbox_cli("migrate", url=roles.url("outbox_owner"))
    assert again.returncode == 0, again.stderr
    assert "nothing to apply" in again.stdout
    with psycopg.connect(roles.url("outbox_owner"), autocommit=True) as owner:
        migrate(owner, "outbox", [core_line(), FIXTURE_LINE])
        owner.execute(
            "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
            "VALUES ('TEST_NOOP', false, true, 'test')"
        )
    with psycopg.connect(roles.admin_db_url, autocommit=True) as admin:
        admin.execute(roles.rendered(after_migrate))

    registry = KindRegistry()
    registry.register(NoopAdapter, distribution="(test)")
    outbox = Outbox(schema="outbox", registry=registry)
    with psycopg.connect(roles.url("outbox_app")) as app:
        request = ActionRequest(kind="TEST_NOOP", lane_key="l", idempotency_key="k1", payload={})
        first_id = outbox.enqueue(app, request).id
        assert outbox.enqueue(app, request).id == first_id

    from outbox_core.testing import drain

    # A database of this test's own making, not a clone of the harness's template.
    assert drain(outbox, roles.url("outbox_worker"), allow_any_database=True) >= 1
    with psycopg.connect(roles.url("outbox_worker"), autocommit=True) as worker:
        state = worker.execute("SELECT state FROM outbox.agent_action").fetchone()
        assert state == (ActionState.DONE.value,)

        # The trigger keeps an ended row as it is, for the worker too.
        with pytest.raises(psycopg.Error):
            worker.execute("UPDATE outbox.agent_action SET stop_reason = 'x'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("DROP TABLE outbox.agent_action")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("SELECT * FROM elsewhere.secret")

    with psycopg.connect(roles.url("outbox_app"), autocommit=True) as app:
        for forbidden in (
            "UPDATE outbox.agent_action SET due_at = now()",
            "DELETE FROM outbox.agent_action",
            "DROP TABLE outbox.action_lane",
            "SELECT * FROM elsewhere.secret",
            "SELECT * FROM outbox.schema_migration",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(forbidden)


def test_migrate_without_the_schema_or_the_right_to_create_it_says_what_to_do(
    roles: Roles,
) -> None:
    with psycopg.connect(roles.admin_db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(roles.names["outbox_owner"]))
        )
    result = outbox_cli("migrate", url=roles.url("outbox_owner"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "schema 'outbox' does not exist" in result.stderr
    assert "CREATE SCHEMA" in result.stderr
