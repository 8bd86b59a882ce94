"""The core's schema change of issue 34 (migrations 20 to 22: the lane rule and the failed
actions in tables of their own, the indexes on `state` and `ended_at` dropped) applied while a
replica of the build before it runs, and then both builds side by side: the older replica
survives. Its claims, fences, endings, expiry, retention and gauges go on without an error or a
warning; one action of a lane executes at a time throughout (watched every few milliseconds);
every action runs exactly once (or expires first), each lane in id order; and the lane table of the new layout holds
exactly the executing actions when they are done.

The older build is the one before this change (OLD_BUILD), its ``outbox_core`` taken from this
repository's history with ``git archive``; each build runs in a process of its own
(rolling/layout_build.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import threading
import time
from datetime import timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    KindRegistry,
    Outbox,
)
from outbox_core.migrations import migrate

from .rolling.layout_build import KIND, RECORD

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().parent / "rolling" / "layout_build.py"
OLD_BUILD = "749498e234ff5bf4849b9f14d29123f448bf41a9"
NEW_SRC = ROOT / "outbox-core" / "src"
LANES = 12
HELD = "ROLL_HELD"
CLAIM_BY_HAND = (
    "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = epoch + 1, "
    "attempt = attempt + 1, lease_until = now() + interval '5 minutes' WHERE id = %s"
)

pytestmark = pytest.mark.slow


class Body(BaseModel):
    n: int = 0


class Enqueued(ActionAdapter):
    """The kind as the producers here know it (they only enqueue; the replicas run it)."""

    kind = KIND
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Body)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        raise AssertionError("only the replicas' processes execute")


def old_source(into: Path) -> Path:
    """The older build's outbox_core package, from this repository's history."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", OLD_BUILD, "outbox-core/src/outbox_core"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pytest.fail(
            f"the older build {OLD_BUILD[:12]} is not in this checkout's history ({exc}; "
            f"{detail.decode(errors='replace').strip()}): this test needs a clone with history"
        )
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "outbox-core" / "src"


def runner(src: Path, url: str, build: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(RUNNER), "--src", str(src), "--url", url, "--build", build, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(process: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


class Producer(threading.Thread):
    """Enqueues actions into LANES lanes until stopped, a few of them slow (a second)."""

    def __init__(self, outbox: Outbox, url: str) -> None:
        super().__init__(daemon=True)
        self.outbox, self.url = outbox, url
        self.stop = threading.Event()
        self.ids: list[int] = []
        self.expiring_ids: set[int] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            with psycopg.connect(self.url) as conn:
                while not self.stop.is_set():
                    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
                    batch = []
                    for _ in range(5):
                        n += 1
                        slow = ":slow" if n % 40 == 0 else ""
                        # Some expire soon: behind a slow head, the expiry sweeps end them.
                        expires = now + timedelta(seconds=0.2) if n % 9 == 0 else None
                        batch.append(
                            ActionRequest(
                                KIND, f"lane-{n % LANES}", f"a-{n}{slow}", expires_at=expires
                            )
                        )
                    for request, enqueued in zip(
                        batch, self.outbox.enqueue_many(conn, batch), strict=True
                    ):
                        self.ids.append(enqueued.id)
                        if request.expires_at is not None:
                            self.expiring_ids.add(enqueued.id)
                    conn.commit()
                    time.sleep(0.02)
        except BaseException as exc:
            self.error = exc


class Watch(threading.Thread):
    """Reads the executing actions by lane until stopped; keeps every lane seen with two."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.doubled: list[Any] = []
        self.looks = 0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                self.doubled += conn.execute(
                    "SELECT lane_key, array_agg(id) FROM outbox.agent_action "
                    "WHERE state = 'EXECUTING' GROUP BY lane_key HAVING count(*) > 1"
                ).fetchall()
                self.looks += 1
                time.sleep(0.005)


def test_the_build_before_survives_the_hot_layout_and_runs_beside_the_new_build(
    empty_database: str, tmp_path: Path
) -> None:
    url = empty_database
    old_src = old_source(tmp_path / "old")
    migrated = result(runner(old_src, url, "old", "migrate"))
    assert migrated["applied"][-1] == "core/0019_find_indexes"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RECORD)
        conn.execute(
            "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
            "VALUES (%s, false, true, 'rolling'), (%s, false, true, 'rolling')",
            (KIND, HELD),
        )
        # An action of a kind no replica serves, claimed by hand before the change and held
        # across it, and one behind it in its lane.
        held, behind = (
            conn.execute(
                "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
                "idempotency_key, payload, max_attempts) "
                "VALUES (%s, false, true, 'held-lane', %s, '{}', 5) RETURNING id",
                (HELD, key),
            ).fetchone()[0]  # type: ignore[index]
            for key in ("held-1", "held-2")
        )
        conn.execute(CLAIM_BY_HAND, (held,))
    registry = KindRegistry()
    registry.register(Enqueued, distribution="outbox-rolling", version="new")
    outbox = Outbox(schema="outbox", registry=registry)
    producer, watch = Producer(outbox, url), Watch(url)
    producer.start()
    watch.start()
    old = runner(old_src, url, "old", "run", "--seconds", "12")
    time.sleep(3)  # the older replica claims, fences and ends on the schema it knows
    with psycopg.connect(url, autocommit=True) as conn:
        applied = [m.label for m in migrate(conn, "outbox", [])]
        # In one snapshot, while the older replica runs: its executing actions, and the lanes
        # the migration gave them (and its claims and endings since kept).
        holders_then, executing_then = conn.execute(
            "SELECT (SELECT array_agg(action_id ORDER BY action_id) FROM outbox.action_executing),"
            " (SELECT array_agg(id ORDER BY id) FROM outbox.agent_action WHERE state = 'EXECUTING')"
        ).fetchone()  # type: ignore[misc]
    assert applied == ["core/0020_lane_holders", "core/0021_hot_layout", "core/0022_settle_v3"]
    assert holders_then == executing_then
    with psycopg.connect(url, autocommit=True) as conn:
        # The action held across the change holds its lane in the new layout too.
        assert conn.execute(
            "SELECT action_id FROM outbox.action_executing WHERE lane_key = 'held-lane'"
        ).fetchall() == [(held,)]
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(CLAIM_BY_HAND, (behind,))
        conn.execute(
            "UPDATE outbox.agent_action SET state = 'DONE', stop_reason = 'TEST', payload = NULL "
            "WHERE id = %s",
            (held,),
        )
        conn.execute(CLAIM_BY_HAND, (behind,))
        conn.execute(
            "UPDATE outbox.agent_action SET state = 'DONE', stop_reason = 'TEST', payload = NULL "
            "WHERE id = %s",
            (behind,),
        )
    new = runner(NEW_SRC, url, "new", "run", "--seconds", "8")
    time.sleep(5)
    producer.stop.set()
    producer.join()
    assert producer.error is None
    old_result, new_result = result(old), result(new)
    # Whatever is left runs on the new build alone.
    last = result(runner(NEW_SRC, url, "new-last", "run", "--seconds", "60", "--until-done"))
    watch.stop.set()
    watch.join()

    assert watch.doubled == [] and watch.looks > 100
    # A stale ending is the conditional write doing its job (an expiry sweep's ending of an
    # action that the claim, or the other replica's sweep, ended first): not a failure.
    for outcome in (old_result, new_result, last):
        failures = [w for w in outcome["warnings"] if "action.end.stale" not in w]
        assert failures == [], (outcome["build"], failures)
    assert old_result["started"] > 0 and new_result["started"] > 0
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM outbox.agent_action "
            "WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')"
        ).fetchone()
        runs = conn.execute(
            "SELECT action_id, count(*), min(build), array_agg(lane_key) "
            "FROM public.layout_record GROUP BY action_id"
        ).fetchall()
        order = conn.execute(
            "SELECT lane_key, array_agg(action_id ORDER BY at) FROM public.layout_record "
            "GROUP BY lane_key"
        ).fetchall()
        holders = conn.execute("SELECT count(*) FROM outbox.action_executing").fetchone()
    assert left == (0,)  # none is live
    ran = {r[0] for r in runs}
    assert ran <= set(producer.ids)
    # Every action ran, but for those that expired first (never run, ended CANCELLED).
    assert set(producer.ids) - ran <= producer.expiring_ids
    assert [r for r in runs if r[1] != 1] == []  # exactly once
    assert {r[2] for r in runs} >= {"new", "old"}
    for lane, ids in order:
        assert ids == sorted(ids), lane
    assert holders == (0,)
