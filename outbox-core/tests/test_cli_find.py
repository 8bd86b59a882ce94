"""`outbox actions`: the search of outbox_core.search from the command line, as a table of 80
columns or as JSON, a page at a time with the cursor it prints, and one line naming the option
for a wrong value."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from outbox_core import ActionRequest
from outbox_core.cli import main
from outbox_core.testing import OutboxTestDatabase


def outbox(db: OutboxTestDatabase, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"OUTBOX_DATABASE_URL": db.url})


def enqueue(db: OutboxTestDatabase, count: int) -> list[int]:
    with db.connect() as conn:
        ids = [
            db.outbox.enqueue(
                conn,
                ActionRequest(
                    "TEST_NOOP",
                    "a-lane-whose-name-is-longer-than-its-column",
                    f"key:{n}:" + "x" * 40,
                ),
            ).id
            for n in range(count)
        ]
        conn.commit()
    return ids


def test_actions_answers_help_with_every_filter() -> None:
    result = CliRunner().invoke(main, ["actions", "--help"])
    assert result.exit_code == 0
    for option in ("--kind", "--state", "--stop-reason", "--lane", "--key-prefix", "--cursor"):
        assert option in result.output


def test_actions_prints_a_table_of_80_columns_and_the_cursor_of_the_next_page(
    db: OutboxTestDatabase,
) -> None:
    ids = enqueue(db, 3)
    first = outbox(db, "actions", "--kind", "TEST_NOOP", "--limit", "2")
    assert first.exit_code == 0, first.output
    lines = first.output.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split()[:4] == ["ID", "STATE", "KIND", "LANE"]
    assert [int(line.split()[0]) for line in lines[1:3]] == [ids[2], ids[1]]
    assert lines[-1].startswith("next page: --cursor ")
    cursor = lines[-1].split()[-1]
    second = outbox(db, "actions", "--kind", "TEST_NOOP", "--limit", "2", "--cursor", cursor)
    assert second.exit_code == 0, second.output
    rows = second.output.splitlines()[1:]
    assert [int(line.split()[0]) for line in rows] == [ids[0]]


def test_actions_json_prints_the_page(db: OutboxTestDatabase) -> None:
    ids = enqueue(db, 2)
    result = outbox(db, "actions", "--state", "admitted,CANCELLED", "--json", "--limit", "1")
    assert result.exit_code == 0, result.output
    page = json.loads(result.output)
    assert [action["id"] for action in page["actions"]] == [ids[1]]
    assert page["next_cursor"] and page["more_may_match"] is False


def test_actions_that_match_nothing_say_so(db: OutboxTestDatabase) -> None:
    enqueue(db, 1)
    result = outbox(db, "actions", "--lane", "no-such-lane")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "no action matches"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state", "DONEE"], "--state: 'DONEE' is not a state"),
        (["--kind", "email"], "--kind: 'email' is not a kind"),
        (["--since", "yesterday"], "--since: 'yesterday' is not a time with its offset"),
        (["--until", "2026-12-03T10:00:00"], "--until: '2026-12-03T10:00:00' is not a time"),
        (["--limit", "0"], "--limit: 0 is not a page size from 1 to 500"),
        (["--limit", "many"], "--limit: 'many' is not a page size"),
        (["--key", "a", "--key-prefix", "a"], "--key-prefix: give a key or a key prefix"),
        (["--lane", ""], "--lane: empty"),
        (["--cursor", "junk"], "--cursor: 'junk' is not a cursor"),
    ],
)
def test_a_wrong_filter_value_is_one_line_naming_the_option(
    db: OutboxTestDatabase, args: list[str], message: str
) -> None:
    result = outbox(db, "actions", *args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [result.output.strip()]
    assert result.output.startswith(f"outbox: error: {message}")


def test_a_cursor_printed_for_one_filter_is_refused_for_another(db: OutboxTestDatabase) -> None:
    enqueue(db, 2)
    page = json.loads(outbox(db, "actions", "--json", "--limit", "1").output)
    result = outbox(db, "actions", "--kind", "TEST_NOOP", "--cursor", page["next_cursor"])
    assert result.exit_code == 2
    assert "--cursor: it belongs to a search with another filter" in result.output
