"""``drain`` makes every waiting action due, so it runs only on a test database (issue 31 item
6): one the pytest plugin cloned from its template, or where the caller says
``allow_any_database=True``. Anywhere else it refuses, naming what to use instead, and changes
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox_core import ActionRequest, KindRegistry, Outbox
from outbox_core.migrations import core_line, migrate
from outbox_core.testing import NotATestDatabase, OutboxTestDatabase, adrain, drain
from outbox_core.testing.database import fresh_database

from .kinds import NoopAdapter


@pytest.fixture
def own_database(outbox_server: str) -> Iterator[tuple[str, Outbox, int]]:
    """A migrated database that the harness did not clone (an application's, say), holding one
    action due tomorrow: (its URL, an Outbox for it, the action's id)."""
    with fresh_database(outbox_server, "template0", prefix="outbox_own") as (url, _):
        registry = KindRegistry()
        registry.register(NoopAdapter, distribution="(test)")
        outbox = Outbox(schema="outbox", registry=registry)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn, "outbox", [core_line()])
            conn.execute(
                "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
                "VALUES ('TEST_NOOP', false, true, 'test')"
            )
        with psycopg.connect(url) as conn:
            [tomorrow] = conn.execute("SELECT now() + interval '1 day'").fetchall()[0]
            request = ActionRequest("TEST_NOOP", "l", "k", {}, not_before=tomorrow)
            action_id = outbox.enqueue(conn, request).id
        yield url, outbox, action_id


def _waiting(url: str, action_id: int) -> tuple[str, bool]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT state, due_at > now() + interval '23 hours' FROM outbox.agent_action "
            "WHERE id = %s",
            (action_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_drain_refuses_a_database_the_harness_did_not_make_and_changes_nothing(
    own_database: tuple[str, Outbox, int],
) -> None:
    url, outbox, action_id = own_database
    with pytest.raises(NotATestDatabase) as refused:
        drain(outbox, url)
    message = str(refused.value)
    assert "outbox run --once" in message and "allow_any_database=True" in message
    assert "outbox_own_" in message  # names the database, not its password
    with pytest.raises(NotATestDatabase):
        asyncio.run(adrain(outbox, url))
    assert _waiting(url, action_id) == ("ADMITTED", True)


def test_drain_with_allow_any_database_runs_there(own_database: tuple[str, Outbox, int]) -> None:
    url, outbox, action_id = own_database
    assert drain(outbox, url, allow_any_database=True) == 1
    assert _waiting(url, action_id) == ("DONE", False)


def test_drain_runs_on_a_clone_of_the_template(db: OutboxTestDatabase) -> None:
    tomorrow = db.scalar("SELECT now()") + timedelta(days=1)
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "l", "k", {}, not_before=tomorrow))
        conn.commit()
    assert drain(db.outbox, db.url) == 1
    assert db.scalar("SELECT state FROM {schema}.agent_action") == "DONE"
