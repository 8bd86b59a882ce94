"""Rows from a newer build: an older replica never claims, reclaims, reaps, counts or fails
them, and they keep their lane; the newer replica runs everything in lane order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox_core import ActionRequest, Outbox
from outbox_core.testing import OutboxTestDatabase

from .rolling.builds import KIND, NEW_KIND, RECORD, SCENARIOS, key, kind_of, payload, registry

RUN_BUILD = Path(__file__).resolve().parent / "rolling" / "run_build.py"


def run_build(db: OutboxTestDatabase, build: int, scenario: str) -> dict[str, Any]:
    completed = subprocess.run(
        [
            sys.executable,
            str(RUN_BUILD),
            "--build",
            str(build),
            "--scenario",
            scenario,
            "--url",
            db.url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def state(db: OutboxTestDatabase, action_id: int) -> tuple[Any, ...]:
    return tuple(
        db.rows(
            "SELECT state, epoch, stop_reason FROM {schema}.agent_action WHERE id = %s",
            (action_id,),
        )[0]
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_an_older_build_leaves_a_newer_builds_rows_alone_and_they_keep_their_lane(
    outbox_db: OutboxTestDatabase, scenario: str
) -> None:
    db = outbox_db
    db.execute(RECORD)
    # Expand first: the newer build's migrations registered both kinds before any replica ran.
    db.execute(
        "INSERT INTO {schema}.action_kind (kind, at_most_once, instance_level, line) VALUES (%s, false, true, 'rolling'), (%s, false, true, 'rolling') ON CONFLICT DO NOTHING",
        (KIND, NEW_KIND),
    )
    newer = Outbox(
        schema=db.schema, registry=registry(2, scenario), host=db.host, settings=db.settings
    )

    def enqueue(conn: psycopg.Connection, variant: str, name: str, lane: str) -> int:
        request = ActionRequest(
            kind_of(scenario, variant),
            lane,
            key(scenario, variant, name),
            payload=payload(scenario, variant),
        )
        return newer.enqueue(conn, request).id

    with db.connect() as conn:
        b_head = enqueue(conn, "b", "b-head", "shared")
        a_behind = enqueue(conn, "a", "a-behind", "shared")
        a_alone = enqueue(conn, "a", "a-alone", "alone")
        b_crashed = enqueue(conn, "b", "b-crashed", "crashed")
        conn.commit()
    # A build-2 replica died holding b_crashed: its lease has run out.
    db.execute(
        "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() - interval '1 s' WHERE id = %s",
        (b_crashed,),
    )

    sample = run_build(db, 1, scenario)
    assert state(db, a_alone) == ("DONE", 1, "COMPLETED")
    assert state(db, b_head) == ("ADMITTED", 0, None)  # not claimed, not failed
    assert state(db, a_behind) == ("ADMITTED", 0, None)  # waits behind the row it cannot decode
    assert state(db, b_crashed) == ("EXECUTING", 1, None)  # not reclaimed, not reaped
    assert sample["executing"].get(KIND, 0) == 0  # the crashed b row is not counted
    # a_behind waits behind a head this build cannot decode: waiting, not due; b_head is not
    # counted at all, and neither is the crashed b row.
    assert sample["due"].get(KIND, 0) == 0
    assert sample["waiting"].get(KIND, 0) == 1
    assert sample["due"].get(NEW_KIND, 0) == 0
    assert sample["waiting"].get(NEW_KIND, 0) == 0

    run_build(db, 2, scenario)
    for action_id in (b_head, a_behind, b_crashed):
        assert db.rows("SELECT state FROM {schema}.agent_action WHERE id = %s", (action_id,)) == [
            ("DONE",)
        ]
    runs = db.rows("SELECT action_id, build, write_started FROM public.rolling_record ORDER BY at")
    assert [r[0] for r in runs if r[0] in (b_head, a_behind)] == [b_head, a_behind]  # lane order
    assert {r[0]: r[1] for r in runs} == {a_alone: 1, b_head: 2, a_behind: 2, b_crashed: 2}
    assert state(db, b_crashed)[1] == 2  # reclaimed by build 2, epoch raised
