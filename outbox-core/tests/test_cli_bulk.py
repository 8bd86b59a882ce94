"""The bulk forms of `outbox resolve` and `outbox retry` against a real database: the actions
chosen by the filters of `outbox actions`, only among the states the command acts on, shown by
--dry-run, confirmed for more than one, refused whole when none or too many match."""

from __future__ import annotations

import asyncio

import pytest

from outbox_core.testing import OutboxTestDatabase

from .operator_support import audits, ended_by_executor, failed_before_writing, fence_then_uncertain
from .test_cli import noop_installed, outbox

__all__ = ["noop_installed"]  # the fixture, used by name below


def count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def made(db: OutboxTestDatabase, *scripted: tuple[object, str]) -> list[int]:
    return [asyncio.run(ended_by_executor(db, script, key)) for script, key in scripted]


def test_bulk_retry_by_key_prefix_runs_again_only_the_failed_ones(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    failed = made(db, *((failed_before_writing, f"bulk-{n}") for n in range(3)))
    uncertain, other = made(db, (fence_then_uncertain, "bulk-u"), (failed_before_writing, "else"))
    dry = outbox(db, "retry", "--key-prefix", "bulk-", "--reason", "fixed", "--dry-run")
    assert dry.exit_code == 0, dry.output
    for action_id in failed:
        assert f"would change action {action_id} (TEST_SCRIPTED)" in dry.output
    assert f"action {uncertain} " not in dry.output and f"action {other} " not in dry.output
    assert count(db) == 5
    unconfirmed = outbox(db, "retry", "--key-prefix", "bulk-", "--reason", "fixed")
    assert unconfirmed.exit_code == 2
    assert "run again 3 actions: pass --yes" in unconfirmed.output and count(db) == 5
    done = outbox(db, "retry", "--key-prefix", "bulk-", "--reason", "fixed", "--yes")
    assert done.exit_code == 0, done.output
    assert count(db) == 8
    keys = {row[0] for row in db.rows("SELECT idempotency_key FROM {schema}.agent_action")}
    assert {f"bulk-{n}#retry-1" for n in range(3)} <= keys
    assert "bulk-u#retry-1" not in keys and "else#retry-1" not in keys
    assert [a[1] for a in audits(db, failed[0])] == ["retry"]


def test_bulk_resolve_chooses_only_uncertain_actions(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    first, second, failed = made(
        db,
        (fence_then_uncertain, "res-1"),
        (fence_then_uncertain, "res-2"),
        (failed_before_writing, "res-3"),
    )
    result = outbox(
        db, "resolve", "--kind", "TEST_SCRIPTED", "--not-done", "--reason", "checked", "--yes"
    )
    assert result.exit_code == 0, result.output
    assert f"changed action {first} (TEST_SCRIPTED): UNCERTAIN -> FAILED" in result.output
    assert f"changed action {second} (TEST_SCRIPTED): UNCERTAIN -> FAILED" in result.output
    assert audits(db, failed) == []
    assert audits(db, first)[0][1:4] == ("resolve_absent", "checked", "cli")


def test_a_filter_that_matches_nothing_is_one_line_and_exit_1(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    made(db, (failed_before_writing, "none-1"))
    result = outbox(db, "resolve", "--lane", "lane-none-1", "--not-done", "--reason", "x")
    assert result.exit_code == 1
    assert "no UNCERTAIN action matches the filter: nothing was changed" in result.output
    assert audits(db, 1) == [] and count(db) == 1


def test_more_matches_than_max_are_refused_whole(noop_installed: OutboxTestDatabase) -> None:
    db = noop_installed
    made(db, *((failed_before_writing, f"max-{n}") for n in range(3)))
    result = outbox(db, "retry", "--key-prefix", "max-", "--max", "2", "--reason", "x", "--yes")
    assert result.exit_code == 1
    assert "more than 2 actions match the filter: nothing was changed" in result.output
    assert count(db) == 3
    enough = outbox(db, "retry", "--key-prefix", "max-", "--max", "3", "--reason", "x", "--yes")
    assert enough.exit_code == 0, enough.output
    assert count(db) == 6


def test_done_with_a_filter_that_matches_more_than_one_is_refused(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    made(db, (fence_then_uncertain, "two-1"), (fence_then_uncertain, "two-2"))
    args = ("--key-prefix", "two-", "--done", "--ref", "m-1", "--reason", "x", "--yes")
    result = outbox(db, "resolve", *args)
    assert result.exit_code == 1
    assert "the filter matches 2 actions: resolve one action at a time" in result.output
    states = {row[0] for row in db.rows("SELECT state FROM {schema}.agent_action")}
    assert states == {"UNCERTAIN"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", "1", "--kind", "EMAIL", "--reason", "x"], "by id or by a filter, not both"),
        (["retry", "--reason", "x"], "name the actions: ids, or a filter"),
        (["retry", "1", "--max", "5", "--reason", "x"], "--max goes with a filter"),
        (["retry", "--state", "DONE", "--reason", "x"], "on FAILED or CANCELLED actions only"),
        (["resolve", "--state", "FAILED", "--not-done", "--reason", "x"], "UNCERTAIN actions"),
        (["retry", "--kind", "email", "--reason", "x"], "--kind: 'email' is not a kind"),
        (["retry", "--since", "yesterday", "--reason", "x"], "--since: 'yesterday' is not a time"),
        (["retry", "--kind", "EMAIL", "--max", "0", "--reason", "x"], "Invalid value for '--max'"),
    ],
)
def test_bad_bulk_forms_are_usage_errors_that_change_nothing(
    noop_installed: OutboxTestDatabase, args: list[str], message: str
) -> None:
    db = noop_installed
    made(db, (failed_before_writing, "bad-1"))
    result = outbox(db, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert count(db) == 1
