"""`outbox erase --dry-run` with outbox-slack installed counts the subject's Slack rows too, as the
erasure deletes them (the turns, and their entries through the turn's cascade), and deletes
nothing; the erasure then deletes what the dry run counted."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from outbox_core.cli import main
from outbox_core.testing import OutboxTestDatabase

from .conftest import post


def erase(db: OutboxTestDatabase, *args: str) -> Result:
    env = {"OUTBOX_DATABASE_URL": db.url, "OUTBOX_SCHEMA": db.schema}
    return CliRunner().invoke(main, ["erase", "--subject", "acct-1", *args], env=env)


def test_the_dry_run_counts_the_slack_rows_the_erasure_deletes_and_deletes_nothing(
    slack_db: OutboxTestDatabase,
) -> None:
    post(slack_db, "t1", 3, subject_account_id="acct-1")
    post(slack_db, "t2", 2, subject_account_id="acct-2")
    slack_db.drain()
    before = slack_db.contents()

    dry = erase(slack_db, "--dry-run")

    assert dry.exit_code == 0, dry.output
    assert slack_db.contents() == before
    would = json.loads(dry.output)
    deleted = {table: rows["deleted"] for table, rows in would["tables"].items()}
    schema = slack_db.schema
    assert deleted[f"{schema}.agent_action"] == 1
    assert deleted[f"{schema}.slack_turn"] == 1
    assert deleted[f"{schema}.slack_entry"] == 3  # not counted by the catalog: its cascade
    assert would["catalogs"]["slack"] == 1

    erased = erase(slack_db)

    assert erased.exit_code == 0, erased.output
    assert json.loads(erased.output)["tables"] == would["tables"]
    after = slack_db.contents()
    assert len(after["slack_entry"]) == len(before["slack_entry"]) - 3
    assert slack_db.rows("SELECT turn_id FROM {schema}.slack_turn") == [("t2",)]
