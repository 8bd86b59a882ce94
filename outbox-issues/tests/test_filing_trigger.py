"""The trigger guard_issue_filing against the one table of transitions (domain.TRANSITIONS)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import psycopg
import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_issues.domain import TRANSITIONS, FilingState, allows

TABLE = '"outbox".issue_filing'


def put_in_state(conn: psycopg.Connection, state: FilingState, report: str) -> None:
    """A filing in ``state``, reached through allowed steps only."""
    conn.execute(f"INSERT INTO {TABLE} (report_id, workspace_id) VALUES (%s, 'ws')", (report,))
    path = {
        FilingState.NEW: [],
        FilingState.DRAFT_CLAIMED: ["DRAFT_CLAIMED"],
        FilingState.DRAFT_WAITING: ["DRAFT_CLAIMED", "DRAFT_WAITING"],
        FilingState.ANSWERED: ["ANSWERED"],
        FilingState.FILING: ["FILING"],
        FilingState.FILED: ["FILING", "FILED"],
        FilingState.STOPPED: ["STOPPED"],
    }[state]
    for step in path:
        conn.execute(f"UPDATE {TABLE} SET state = %s WHERE report_id = %s", (step, report))


def disagreements(
    db: OutboxTestDatabase, table: Mapping[FilingState, frozenset[FilingState]]
) -> list[tuple[FilingState, FilingState, bool]]:
    found = []
    with db.connect(autocommit=True) as conn:
        for number, (old, new) in enumerate(itertools.product(FilingState, FilingState)):
            report = f"pair-{number}"
            put_in_state(conn, old, report)
            try:
                with conn.transaction():
                    conn.execute(
                        f"UPDATE {TABLE} SET state = %s WHERE report_id = %s", (str(new), report)
                    )
                did = True
            except psycopg.errors.CheckViolation:
                did = False
            if did != (old is new or new in table[old]):
                found.append((old, new, did))
    return found


def test_every_ordered_pair_of_filing_states_is_allowed_exactly_when_the_table_allows_it(
    outbox_db: OutboxTestDatabase,
) -> None:
    assert disagreements(outbox_db, TRANSITIONS) == []


def test_a_changed_table_disagrees_with_the_trigger_on_exactly_the_changed_pairs(
    outbox_db: OutboxTestDatabase,
) -> None:
    changed = dict(TRANSITIONS)
    changed[FilingState.STOPPED] = frozenset({FilingState.NEW, FilingState.FILED})
    changed[FilingState.FILING] = frozenset({FilingState.FILED})
    assert disagreements(outbox_db, changed) == [
        (FilingState.FILING, FilingState.STOPPED, True),
        (FilingState.STOPPED, FilingState.FILED, False),
    ]


def test_the_transition_rows_in_the_database_are_the_python_table(
    outbox_db: OutboxTestDatabase,
) -> None:
    rows = set(outbox_db.rows("SELECT from_state, to_state FROM {schema}.issue_filing_transition"))
    expected = {(str(old), str(new)) for old, targets in TRANSITIONS.items() for new in targets}
    assert rows == expected


@pytest.mark.parametrize("state", [s for s in FilingState if s is not FilingState.NEW])
def test_a_new_filing_is_new(outbox_db: OutboxTestDatabase, state: FilingState) -> None:
    with (
        outbox_db.connect(autocommit=True) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="a new filing is NEW"),
    ):
        conn.execute(
            f"INSERT INTO {TABLE} (report_id, workspace_id, state) VALUES ('x', 'ws', %s)",
            (str(state),),
        )


def test_the_python_rule_allows_every_same_state_update() -> None:
    assert all(allows(state, state) for state in FilingState)


def test_the_readme_table_of_transitions_is_the_python_table() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text("utf-8")
    section = readme.split("## The filing's states", 1)[1].split("\n## ", 1)[0]
    before_filed = {
        FilingState.NEW,
        FilingState.DRAFT_CLAIMED,
        FilingState.DRAFT_WAITING,
        FilingState.ANSWERED,
        FilingState.FILING,
    }
    found: set[tuple[FilingState, FilingState]] = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0] or cells[0] in ("from", "---"):
            continue
        olds = (
            before_filed
            if cells[0] == "every state before `FILED`"
            else {FilingState(name) for name in re.findall(r"`(\w+)`", cells[0])}
        )
        news = {FilingState(name) for name in re.findall(r"`(\w+)`", cells[1])}
        found |= {(old, new) for old in olds for new in news}
    assert found == {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
