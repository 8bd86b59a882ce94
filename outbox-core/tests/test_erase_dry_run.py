"""`outbox erase --dry-run` says what the erasure would delete, per table, and deletes nothing;
on a terminal the erasure asks first (showing those counts) unless `--yes`; a script erases
without asking, as before."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from outbox_core import ActionRequest, OutboxError, preview_erasure
from outbox_core.testing import OutboxTestDatabase

from .test_cli import enqueue, noop_installed, outbox

__all__ = ["noop_installed"]  # the fixture, used below by name

SUBJECT = "person-1"


def subject_actions(db: OutboxTestDatabase) -> None:
    """Two actions of the subject in two lanes (one of them ahead of another account's), and
    one of another account."""
    enqueue(db, "a", subject_account_id=SUBJECT)
    enqueue(db, "b", subject_account_id="person-2")
    with db.connect() as conn:
        db.outbox.enqueue(
            conn, ActionRequest("TEST_NOOP", f"account:{SUBJECT}", "c", subject_account_id=SUBJECT)
        )
        conn.commit()


def test_dry_run_counts_per_table_what_the_erasure_then_deletes_and_deletes_nothing(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    subject_actions(db)
    before = db.contents()

    dry = outbox(db, "erase", "--subject", SUBJECT, "--dry-run")

    assert dry.exit_code == 0, dry.output
    assert db.contents() == before, "the dry run changed the schema's rows"
    would = json.loads(dry.output)
    assert would["dry_run"] is True and would["actions"] == 2
    # The lane account:person-1 is left with no live action: its row goes too.
    assert would["tables"]["outbox.agent_action"]["deleted"] == 2
    assert would["tables"]["outbox.action_lane"]["deleted"] == 1

    erased = json.loads(outbox(db, "erase", "--subject", SUBJECT).output)

    assert "dry_run" not in erased
    assert erased["tables"] == would["tables"] and erased["actions"] == would["actions"]
    after = db.contents()
    for table, rows in would["tables"].items():
        name = table.removeprefix(f"{db.schema}.")
        assert len(before[name]) - len(after[name]) == rows["deleted"] - rows["inserted"], table


def test_a_dry_run_inside_the_callers_transaction_undoes_and_counts_only_itself(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    subject_actions(db)
    first = db.scalar("SELECT min(id) FROM {schema}.agent_action")

    async def go() -> tuple[int, int, int, str]:
        async with await db.aconnect() as conn:
            # The caller's own work before the dry run: kept, and not counted as the erasure's.
            await conn.execute(db.outbox.queries["erase_actions"], {"ids": [first]})
            report = await preview_erasure(conn, SUBJECT, outbox=db.outbox)
            cursor = await conn.execute(
                f'SELECT count(*) FROM "{db.schema}".agent_action WHERE subject_account_id = %s',
                (SUBJECT,),
            )
            row = await cursor.fetchone()
            status = conn.info.transaction_status.name
            await conn.rollback()
            assert row is not None
            deleted = report.tables[f"{db.schema}.agent_action"].deleted
            return report.actions, deleted, row[0], status

    # Of the subject's two actions the caller deleted one: the dry run would delete the other.
    assert asyncio.run(go()) == (1, 1, 1, "INTRANS")


def test_a_dry_run_where_the_server_counts_nothing_refuses_rather_than_report_zero(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    subject_actions(db)
    before = db.contents()

    async def go() -> None:
        async with await db.aconnect() as conn:
            await conn.execute("SET track_counts = off")  # a superuser's setting; ours is one
            await conn.commit()
            await preview_erasure(conn, SUBJECT, outbox=db.outbox)

    with pytest.raises(OutboxError, match="track_counts off"):
        asyncio.run(go())
    assert db.contents() == before


def subject_left(db: OutboxTestDatabase) -> int:
    query = "SELECT count(*) FROM {schema}.agent_action WHERE subject_account_id = %s"
    return int(db.scalar(query, (SUBJECT,)))


def erase_on_a_terminal(db: OutboxTestDatabase, *args: str, answer: str) -> tuple[int, str]:
    """`outbox erase --subject SUBJECT ARGS` in a process whose stdin is a terminal (a pty) on
    which ``answer`` is typed; its exit code and output."""
    leader, follower = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "outbox_core.cli", "erase", "--subject", SUBJECT, *args],
            env={**os.environ, "OUTBOX_DATABASE_URL": db.url},
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        os.write(leader, answer.encode())
        output, _ = proc.communicate(timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    return proc.returncode, output


def test_on_a_terminal_the_erasure_shows_the_counts_and_a_no_erases_nothing(
    db: OutboxTestDatabase,
) -> None:
    subject_actions(db)
    before = db.contents()

    code, output = erase_on_a_terminal(db, answer="n\n")

    assert code == 1, output
    assert '"outbox.agent_action": {"deleted": 2' in output and "erase these rows" in output
    assert "nothing erased" in output
    assert db.contents() == before


def test_on_a_terminal_a_yes_erases(db: OutboxTestDatabase) -> None:
    subject_actions(db)

    code, output = erase_on_a_terminal(db, answer="y\n")

    assert code == 0, output
    assert subject_left(db) == 0


def test_on_a_terminal_yes_erases_without_asking(db: OutboxTestDatabase) -> None:
    subject_actions(db)

    code, output = erase_on_a_terminal(db, "--yes", answer="")

    assert code == 0, output
    assert "erase these rows" not in output and '"dry_run"' not in output
    assert subject_left(db) == 0


def test_without_a_terminal_the_erasure_does_not_ask(db: OutboxTestDatabase) -> None:
    subject_actions(db)

    completed = subprocess.run(
        [sys.executable, "-m", "outbox_core.cli", "erase", "--subject", SUBJECT],
        env={**os.environ, "OUTBOX_DATABASE_URL": db.url},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert "erase these rows" not in completed.stdout + completed.stderr
    assert json.loads(completed.stdout)["actions"] == 2
