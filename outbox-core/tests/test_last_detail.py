"""The last attempt's detail kept on the action: every result carries one, the executor keeps it
(one line, bounded, never the payload), and `outbox show` and `outbox status` show it."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Cancelled,
    Defer,
    Done,
    Failed,
    Reread,
    Retry,
    Uncertain,
)
from outbox_core.executor.outcomes import clean_detail
from outbox_core.results import DETAIL_LIMIT
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter
from .test_cli import noop_installed, outbox

__all__ = ["noop_installed"]  # the fixture, imported for the CLI tests below

LATER = timedelta(hours=1)
CANARY = "canary-7f3a@example.org"


def enqueue(db: OutboxTestDatabase, key: str = "k", lane: str = "lane", **fields: Any) -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", lane, key, **fields)).id
        conn.commit()
    return action_id


def last(db: OutboxTestDatabase, action_id: int) -> tuple[str | None, str | None]:
    rows = db.rows(
        "SELECT last_result, last_detail FROM {schema}.agent_action WHERE id = %s", (action_id,)
    )
    return rows[0]


async def attempt_once(db: OutboxTestDatabase) -> None:
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
        await asyncio.gather(*executor.attempts.dispatch(rows))


def returning(result: AdapterResult):  # type: ignore[no-untyped-def]
    async def run(attempt: ActionAttempt) -> AdapterResult:
        return result

    return run


RESULTS = [
    ("Done", Done("ref-1", detail="HTTP 201")),
    ("Retry", Retry(LATER, detail="SMTP 451 4.7.1 greylisted at RCPT")),
    ("Defer", Defer(LATER, detail="Slack ratelimited, Retry-After 60")),
    ("Reread", Reread(LATER, detail="HTTP 502 after the create call")),
    ("Uncertain", Uncertain(detail="timed out after DATA")),
    ("Failed", Failed(detail="HTTP 422 Validation Failed")),
    ("Cancelled", Cancelled(detail="the report was withdrawn")),
]


@pytest.mark.parametrize(("name", "result"), RESULTS, ids=[r[0] for r in RESULTS])
async def test_every_result_keeps_its_detail_on_the_action(
    db: OutboxTestDatabase, name: str, result: AdapterResult
) -> None:
    ScriptedAdapter.script = returning(result)
    action_id = enqueue(db)
    await attempt_once(db)
    assert last(db, action_id) == (name, result.detail)
    shown = db.outbox.get(db.connect(), action_id)
    assert shown is not None and shown.last_detail == result.detail


async def test_an_abandoned_attempt_keeps_no_detail(db: OutboxTestDatabase) -> None:
    ScriptedAdapter.script = returning(Abandoned(detail="another holder"))
    action_id = enqueue(db)
    await attempt_once(db)
    assert last(db, action_id) == (None, None)


async def test_retry_why_still_counts_as_its_detail(db: OutboxTestDatabase) -> None:
    ScriptedAdapter.script = returning(Retry(LATER, why="HTTP 503"))
    action_id = enqueue(db)
    await attempt_once(db)
    assert last(db, action_id) == ("Retry", "HTTP 503")


async def test_an_attempt_that_raised_keeps_the_exception_type_not_its_message(
    db: OutboxTestDatabase,
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        raise ConnectionError(f"could not deliver to {attempt.payload['note']}")

    ScriptedAdapter.script = run
    action_id = enqueue(db, payload={"n": 1, "note": CANARY})
    await attempt_once(db)
    assert last(db, action_id) == ("Retry", "raised ConnectionError")


async def test_a_later_attempt_without_a_detail_clears_the_earlier_one(
    db: OutboxTestDatabase,
) -> None:
    async def run(attempt: ActionAttempt) -> AdapterResult:
        return Retry(detail="SMTP 421 busy") if attempt.number == 1 else Done()

    ScriptedAdapter.script = run
    action_id = enqueue(db)
    await attempt_once(db)
    assert last(db, action_id) == ("Retry", "SMTP 421 busy")
    await db.adrain()
    assert last(db, action_id) == ("Done", None)


async def test_an_older_builds_settle_clears_the_detail(db: OutboxTestDatabase) -> None:
    """A replica of a build before migration 0013 settles through settle_v1, which knows no
    detail: its ending must not leave an earlier attempt's detail beside its own result."""
    ScriptedAdapter.script = returning(Retry(timedelta(0), detail="SMTP 451"))
    action_id = enqueue(db)
    await attempt_once(db)
    db.execute("UPDATE {schema}.agent_action SET due_at = now() WHERE id = %s", (action_id,))
    db.execute("UPDATE {schema}.action_lane SET next_at = now()")
    async with db.executor() as executor:
        rows, _ = await executor.claims.claim(10)
    epoch = next(r[11] for r in rows if r[1] == action_id)
    settled = db.rows(
        "SELECT op, id, last_result FROM {schema}.settle_v1("
        "ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY['EXECUTING'], ARRAY['DONE'], "
        "ARRAY['COMPLETED'], ARRAY[NULL], ARRAY[0.0], ARRAY['keep'], "
        "ARRAY[NULL]::timestamptz[], ARRAY[0], ARRAY['Done'], false, interval '30 seconds', "
        "ARRAY[]::text[], ARRAY[]::jsonpath[], ARRAY[]::text[])",
        (action_id, epoch),
    )
    assert ("ended", action_id, "Done") in settled
    assert last(db, action_id) == ("Done", None)


def test_a_detail_is_kept_as_one_bounded_line() -> None:
    assert clean_detail(None) is None
    assert clean_detail(" \n\t ") is None
    assert clean_detail("SMTP 451\r\n4.7.1\x00 try\x1b[31m later\u2028now") == (
        "SMTP 451 4.7.1 try [31m later now"
    )
    long = clean_detail("x" * 1000)
    assert long is not None and len(long) == DETAIL_LIMIT and long.endswith("\u2026")
    assert clean_detail("HTTP 404 Not Found") == "HTTP 404 Not Found"


async def test_a_detail_that_is_not_a_string_is_a_wrong_result(db: OutboxTestDatabase) -> None:
    ScriptedAdapter.script = returning(Failed(detail=451))  # type: ignore[arg-type]
    action_id = enqueue(db)
    async with db.executor() as executor:
        executor.attempts.wrong_results = []
        rows, _ = await executor.claims.claim(10)
        await asyncio.gather(*executor.attempts.dispatch(rows))
        problems = [str(e) for e in executor.attempts.wrong_results]
    assert any("Failed whose detail is int" in p for p in problems), problems
    assert last(db, action_id) == ("Retry", "raised AdapterContractError")


async def test_show_and_status_show_why_an_action_retries_and_why_one_failed(
    noop_installed: OutboxTestDatabase,
) -> None:
    db = noop_installed
    retrying = enqueue(db, "r", lane="lane-r")
    failing = enqueue(db, "f", lane="lane-f")

    async def run(attempt: ActionAttempt) -> AdapterResult:
        if attempt.id == retrying:
            return Retry(LATER, detail="SMTP 451 4.7.1 greylisted at RCPT")
        return Failed(detail="SMTP 550 5.1.1 at RCPT")

    ScriptedAdapter.script = run
    await attempt_once(db)

    shown = json.loads(outbox(db, "show", str(retrying)).output)
    assert (shown["last_result"], shown["last_detail"]) == (
        "Retry",
        "SMTP 451 4.7.1 greylisted at RCPT",
    )
    report = json.loads(outbox(db, "status", "--json").output)
    assert [(r["id"], r["last_result"], r["detail"]) for r in report["retrying"]] == [
        (retrying, "Retry", "SMTP 451 4.7.1 greylisted at RCPT")
    ]
    assert [
        (r["id"], r["state"], r["stop_reason"], r["detail"]) for r in report["recent_failures"]
    ] == [(failing, "FAILED", "REFUSED", "SMTP 550 5.1.1 at RCPT")]
    text = outbox(db, "status", env={"COLUMNS": "250"}).output  # a row to a line
    assert "SMTP 451 4.7.1 greylisted at RCPT" in text and "SMTP 550 5.1.1 at RCPT" in text


async def test_no_payload_value_reaches_a_detail(db: OutboxTestDatabase) -> None:
    """The canary: whatever an attempt raises or returns without a detail, the detail the
    executor writes holds nothing of the payload."""

    async def run(attempt: ActionAttempt) -> AdapterResult:
        note = attempt.payload["note"]
        match attempt.payload["n"]:
            case 1:
                raise ValueError(note)
            case 2:
                raise TimeoutError(f"talking to {note}")
            case 3:
                return Retry(LATER)
            case _:
                return Failed()

    ScriptedAdapter.script = run
    ids = [
        enqueue(db, f"k{n}", lane=f"lane-{n}", payload={"n": n, "note": CANARY})
        for n in (1, 2, 3, 4)
    ]
    await attempt_once(db)
    details = db.rows("SELECT last_detail FROM {schema}.agent_action WHERE id = ANY(%s)", (ids,))
    assert len(details) == 4
    assert all(CANARY not in (d or "") for (d,) in details), details


async def test_status_prints_a_detail_with_square_brackets_as_it_is(
    noop_installed: OutboxTestDatabase,
) -> None:
    """A detail is the adapter's text, not Rich markup: "[/repos/x/issues]" made `outbox
    status` fail (a closing tag with nothing to close), "[bold]" vanished."""
    db = noop_installed
    enqueue(db, "r", lane="lane-r")
    ScriptedAdapter.script = returning(Retry(LATER, detail="HTTP 502 at [bold]gateway[/bold]"))
    await attempt_once(db)
    enqueue(db, "f", lane="lane-f")
    ScriptedAdapter.script = returning(Failed(detail="HTTP 404 [/repos/x/issues]"))
    await attempt_once(db)

    result = outbox(db, "status", env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "HTTP 502 at [bold]gateway[/bold]" in result.output
    assert "HTTP 404 [/repos/x/issues]" in result.output


def test_status_prints_lane_keys_and_kind_errors_as_they_are(
    noop_installed: OutboxTestDatabase,
) -> None:
    """A lane key is the application's string, not Rich markup: a blocked lane keyed
    "repo[/x]" made `outbox status` fail, "[bold]" vanished."""
    db = noop_installed
    for lane in ("repo[/x]", "team[bold]a"):  # a proposal blocks the action behind it
        enqueue(db, f"{lane}-1", lane=lane, proposed=True)
        enqueue(db, f"{lane}-2", lane=lane)
    result = outbox(db, "status", env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "repo[/x]" in result.output
    assert "team[bold]a" in result.output
