"""Real concurrency: several executors (in one event loop, or as processes) on one database.

No mocks: every executor claims through PostgreSQL, fences and ends through it; the recording
kinds (``tests/procs/executor_proc.py``) write one row per attempt start and end to
``test_record`` on a connection of their own, so the tests can check lane order, that no two
attempts of a lane overlap, and that nothing ran twice.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    AdapterResult,
    Done,
    Outbox,
)
from outbox_core.attempt import LeaseLost
from outbox_core.executor import Executor
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter, Step
from .procs.executor_proc import (
    RECORD_TABLE,
    HangOnceAdapter,
    HangReadAdapter,
    RecordingAdapter,
)

PROC = Path(__file__).resolve().parent / "procs" / "executor_proc.py"
T = TypeVar("T")


# -- helpers -----------------------------------------------------------------------------------


# The server refused a connection because every slot was taken (other suites on a shared
# server): the pool retries and the executor goes on, so this is not the executor's warning.
_SERVER_FULL = "too many clients already"


def own_warnings(stderr: str) -> list[str]:
    """An executor process's stderr lines, without those about a server that was full (a
    refused connection, and the LISTEN connection it cost)."""
    lines = stderr.splitlines()
    full = any(_SERVER_FULL in line for line in lines)
    return [
        line
        for line in lines
        if _SERVER_FULL not in line and not (full and "executor.listen.lost" in line)
    ]


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def await_for(
    predicate: Callable[[], Awaitable[T]], timeout: float, what: str, interval: float = 0.05
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def ascalar(db: OutboxTestDatabase, query: str, params: Any = None) -> Any:
    return await asyncio.to_thread(db.scalar, query, params)


async def arows(db: OutboxTestDatabase, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    return await asyncio.to_thread(db.rows, query, params)


def action(db: OutboxTestDatabase, action_id: int) -> dict[str, Any]:
    rows = db.rows(
        "SELECT state, epoch, attempt, stop_reason, readback_ref, write_started_at, lease_until,"
        " ended_at, last_result FROM {schema}.agent_action WHERE id = %s",
        (action_id,),
    )
    assert rows, f"action {action_id} is gone"
    names = (
        "state",
        "epoch",
        "attempt",
        "stop_reason",
        "readback_ref",
        "write_started_at",
        "lease_until",
        "ended_at",
        "last_result",
    )
    return dict(zip(names, rows[0], strict=True))


async def aaction(db: OutboxTestDatabase, action_id: int) -> dict[str, Any]:
    return await asyncio.to_thread(action, db, action_id)


def records(db: OutboxTestDatabase, action_id: int | None = None) -> list[tuple[Any, ...]]:
    """(action_id, event, pid) in the order they were written."""
    where = "" if action_id is None else "WHERE action_id = %s"
    return db.rows(
        f"SELECT action_id, event, pid FROM test_record {where} ORDER BY at, event",
        None if action_id is None else (action_id,),
    )


def outbox_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("outbox") and r.levelno >= logging.WARNING
    ]


@asynccontextmanager
async def running(executor: Executor) -> AsyncIterator[asyncio.Task[None]]:
    """``executor.run`` in a task; stopped (and its failure raised) on the way out."""
    stop = asyncio.Event()
    task = asyncio.create_task(executor.run(stop), name="test-executor")
    try:
        yield task
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            await executor.close()


def served_kinds(registry_kinds: list[str]) -> list[str]:
    """The core's test kinds only: installed plugins' kinds (e.g. EMAIL) are not built."""
    return [kind for kind in registry_kinds if kind.startswith("TEST_")]


def executor_for(
    db: OutboxTestDatabase, *, outbox: Outbox | None = None, **settings: Any
) -> Executor:
    """An executor of the test kinds with these settings."""
    outbox = outbox if outbox is not None else db.outbox
    merged = db.settings.model_copy(update=settings)
    return Executor(outbox, db.url, settings=merged, kinds=served_kinds(outbox.registry.kinds))


async def listening(db: OutboxTestDatabase, count: int) -> None:
    """Wait until ``count`` executors LISTEN, so a commit wakes all of them at once."""
    await await_for(
        lambda: ascalar(
            db,
            "SELECT count(*) >= %s FROM pg_stat_activity WHERE datname = "
            "current_database() AND query LIKE 'LISTEN%%'",
            (count,),
        ),
        15,
        f"{count} executors to LISTEN",
    )


async def blocked_on_lock(db: OutboxTestDatabase, pid: int) -> bool:
    return bool(
        await ascalar(
            db, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
        )
    )


@pytest.fixture
def rec(db: OutboxTestDatabase) -> OutboxTestDatabase:
    """The recording kinds registered, and the table they record to."""
    for adapter in (RecordingAdapter, HangReadAdapter, HangOnceAdapter):
        db.register_kind(adapter)
    with db.connect(autocommit=True) as conn:
        conn.execute(RECORD_TABLE)
    return db


# -- executor processes ------------------------------------------------------------------------


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"executor {self.pid} exited early:\n{self.stderr()}")
            return f"ready {self.pid}" in self.out.read_text()

        wait_for(ready, timeout, f"executor process {self.pid} to start")

    def stderr(self) -> str:
        return self.err.read_text()

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)


@dataclass
class Procs:
    db: OutboxTestDatabase
    folder: Path
    started: list[Proc] = field(default_factory=list)

    def start(self, kind: str, **options: Any) -> Proc:
        n = len(self.started)
        out, err = self.folder / f"proc{n}.out", self.folder / f"proc{n}.err"
        args = [sys.executable, str(PROC), "--url", self.db.url, "--kind", kind]
        for name, value in options.items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            popen = subprocess.Popen(args, stdout=stdout, stderr=stderr)
        proc = Proc(popen, out, err)
        self.started.append(proc)
        return proc


@pytest.fixture
def procs(rec: OutboxTestDatabase, tmp_path: Path) -> Iterator[Procs]:
    group = Procs(rec, tmp_path)
    try:
        yield group
    finally:
        for proc in group.started:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in group.started:
            try:
                proc.popen.wait(20)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)


# -- a. two executors, one lane head -----------------------------------------------------------


def _recording_executor(db: OutboxTestDatabase, worker: int, **settings: Any) -> Executor:
    merged = db.settings.model_copy(update={"poll_seconds": 0.2, "shutdown_seconds": 5, **settings})
    adapter = RecordingAdapter(db.url, worker=worker, hold=0.02)
    return Executor(
        db.outbox, db.url, settings=merged, kinds=["TEST_RECORD"], adapters={"TEST_RECORD": adapter}
    )


async def _close_adapters(*executors: Executor) -> None:
    for executor in executors:
        adapter = executor.adapter("TEST_RECORD")
        assert isinstance(adapter, RecordingAdapter)
        await adapter.close()


async def test_two_running_executors_woken_by_one_commit_run_the_lane_head_once(
    rec: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    db = rec
    a, b = _recording_executor(db, 1), _recording_executor(db, 2)
    ids = []
    try:
        async with running(a) as run_a, running(b) as run_b:
            await listening(db, 2)
            for round_ in range(20):
                conn = await db.aconnect()
                async with conn:
                    enqueued = await db.outbox.aenqueue(
                        conn, ActionRequest("TEST_RECORD", f"race-{round_}", f"race-{round_}")
                    )
                    await conn.commit()
                ids.append(enqueued.id)
                await await_for(
                    lambda x=enqueued.id: ascalar(
                        db, "SELECT state = 'DONE' FROM {schema}.agent_action WHERE id = %s", (x,)
                    ),
                    10,
                    f"round {round_} to end",
                )
            assert not run_a.done() and not run_b.done()
    finally:
        await _close_adapters(a, b)
    got = db.rows("SELECT action_id, event, count(*) FROM test_record GROUP BY 1, 2 ORDER BY 1, 2")
    assert got == [(i, event, 1) for i in ids for event in ("end", "start")]
    assert db.rows("SELECT DISTINCT state, epoch, attempt FROM {schema}.agent_action") == [
        ("DONE", 1, 1)
    ]
    assert outbox_warnings(caplog) == []
    won = db.rows("SELECT pid, count(*) FROM test_record WHERE event = 'start' GROUP BY 1")
    print(f"rounds won by executor: {dict(won)}")


async def test_two_executors_running_one_action_now_at_once_run_it_once(
    rec: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    db = rec
    a, b = _recording_executor(db, 1), _recording_executor(db, 2)
    winners = Counter[str]()
    try:
        async with a, b:
            for round_ in range(20):
                conn = await db.aconnect()
                async with conn:
                    enqueued = await db.outbox.aenqueue(
                        conn, ActionRequest("TEST_RECORD", f"now-{round_}", f"now-{round_}")
                    )
                    await conn.commit()
                first, second = (a, b) if round_ % 2 else (b, a)
                answers = await asyncio.gather(
                    first.run_now(enqueued.id), second.run_now(enqueued.id)
                )
                ran = [answer for answer in answers if answer is not None]
                assert len(ran) == 1, answers
                assert ran[0].state == "DONE"
                winners["first" if answers[0] is not None else "second"] += 1
                starts = db.scalar(
                    "SELECT count(*) FROM test_record WHERE action_id = %s AND event = 'start'",
                    (enqueued.id,),
                )
                assert starts == 1
    finally:
        await _close_adapters(a, b)
    assert db.rows("SELECT DISTINCT state, epoch, attempt FROM {schema}.agent_action") == [
        ("DONE", 1, 1)
    ]
    assert outbox_warnings(caplog) == []
    print(f"run_now won by: {dict(winners)}")


# -- b. four processes, a thousand lanes ---------------------------------------------------------

# 1,000 lanes x 10 actions: 1,000 x 20 took about 60 s on 2 cores (CPU-bound), too long.
LANES, PER_LANE, SEQ_PER_COMMIT = 1000, 10, 2


@pytest.mark.slow
def test_four_executor_processes_keep_lane_order_without_overlap_or_double_runs(
    rec: OutboxTestDatabase, procs: Procs
) -> None:
    db = rec
    # Two connections each (the fewest an executor takes): four processes share a server with
    # whatever else runs there.
    workers = [
        procs.start("TEST_RECORD", concurrency=50, poll=0.5, hold=0.002, pool_size=2)
        for _ in range(4)
    ]
    for worker in workers:
        worker.wait_ready()
    total = LANES * PER_LANE
    started = time.monotonic()
    # Enqueued in bulk while the executors run, in several commits; ids interleave the lanes.
    with db.connect() as conn:
        for first in range(0, PER_LANE, SEQ_PER_COMMIT):
            db.outbox.enqueue_many(
                conn,
                [
                    ActionRequest(
                        "TEST_RECORD", f"lane-{lane}", f"a-{lane}-{seq}", payload={"n": seq}
                    )
                    for seq in range(first, first + SEQ_PER_COMMIT)
                    for lane in range(LANES)
                ],
            )
            conn.commit()
    wait_for(
        lambda: (
            db.scalar("SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE'") == total
        ),
        180,
        f"{total} actions to end DONE",
        interval=0.5,
    )
    elapsed = time.monotonic() - started
    for worker in workers:
        assert worker.stop() == 0, worker.stderr()
        assert own_warnings(worker.stderr()) == [], worker.stderr()
    print(f"{total} actions by 4 processes in {elapsed:.1f} s")

    assert db.rows(
        "SELECT state, epoch, attempt, count(*) FROM {schema}.agent_action GROUP BY 1, 2, 3"
    ) == [("DONE", 1, 1, total)]
    rows = db.rows("SELECT action_id, lane_key, seq, event, at, pid FROM test_record")
    events = Counter((row[0], row[3]) for row in rows)
    assert set(events.values()) == {1}, [key for key, n in events.items() if n > 1][:10]
    assert Counter(event for _, event in events) == {"start": total, "end": total}
    spans: dict[int, dict[str, Any]] = defaultdict(dict)
    for action_id, lane_key, seq, event, at, pid in rows:
        spans[action_id].update(lane=lane_key, seq=seq, pid=pid, **{event: at})
    lanes: dict[str, list[tuple[Any, int, int, Any]]] = defaultdict(list)
    for action_id, span in spans.items():
        lanes[span["lane"]].append((span["start"], action_id, span["seq"], span["end"]))
    assert len(lanes) == LANES
    for lane_key, attempts in lanes.items():
        attempts.sort()
        ids = [action_id for _, action_id, _, _ in attempts]
        assert ids == sorted(ids), f"{lane_key} ran out of id order: {ids}"
        assert [seq for _, _, seq, _ in attempts] == list(range(PER_LANE)), lane_key
        for before, after in itertools.pairwise(attempts):
            assert after[0] > before[3], (
                f"{lane_key}: action {after[1]} started at {after[0]} before action "
                f"{before[1]} ended at {before[3]}"
            )
    by_pid = Counter(span["pid"] for span in spans.values())
    print(f"attempts per process: {dict(by_pid)}")
    assert len(by_pid) >= 2, by_pid


# -- c. lease expiry and takeover --------------------------------------------------------------


async def test_a_holder_whose_lease_was_taken_over_can_neither_fence_nor_end_the_action(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    a_claimed, a_step1, a_step2, b_claimed, b_release = (asyncio.Event() for _ in range(5))
    seen: dict[str, Any] = {}

    async def script(attempt: ActionAttempt) -> AdapterResult:
        if attempt.epoch == 1:  # executor A
            a_claimed.set()
            await a_step1.wait()
            # The lease ran out but nobody took the action yet: the fence still refuses.
            seen["a_fence_expired"] = await attempt.fence().begin_write()
            seen["a_step1_done"] = True
            await a_step2.wait()
            seen["a_fence_taken"] = await attempt.fence().begin_write()
            try:
                async with attempt.transaction():
                    seen["a_transaction"] = "entered"
            except LeaseLost:
                seen["a_transaction"] = "LeaseLost"
            # A stale holder that ends anyway: its ending names epoch 1 and changes nothing.
            return Done("from-A")
        b_claimed.set()  # executor B, epoch 2
        seen["b_write_started"] = attempt.write_started
        await b_release.wait()
        seen["b_fence"] = await attempt.fence().begin_write()
        return Done("from-B")

    ScriptedAdapter.script = script
    caplog.set_level(logging.WARNING, logger="outbox")
    with db.connect() as conn:
        x = db.outbox.enqueue(conn, ActionRequest("TEST_SCRIPTED", "takeover", "x")).id
        conn.commit()
    a = executor_for(db, lease_seconds=300, fence_margin_seconds=60)
    b = executor_for(db, lease_seconds=300, fence_margin_seconds=60)
    async with a, b:
        task_a = asyncio.create_task(a.run_now(x))
        await asyncio.wait_for(a_claimed.wait(), 10)
        assert (await aaction(db, x))["epoch"] == 1
        # A's lease runs out (an in-place update of an EXECUTING row; the trigger allows it).
        await ascalar(
            db,
            "UPDATE {schema}.agent_action SET lease_until = now() - interval "
            "'1 second' WHERE id = %s RETURNING id",
            (x,),
        )
        a_step1.set()
        await await_for(lambda: asyncio.sleep(0, seen.get("a_step1_done")), 10, "A's first fence")
        assert seen["a_fence_expired"] is False
        task_b = asyncio.create_task(b.run_now(x))
        await asyncio.wait_for(b_claimed.wait(), 10)
        row = await aaction(db, x)
        assert (row["state"], row["epoch"], row["attempt"]) == ("EXECUTING", 2, 2)
        assert seen["b_write_started"] is False

        a_step2.set()
        after_a = await asyncio.wait_for(task_a, 10)
        assert seen["a_fence_taken"] is False
        assert seen["a_transaction"] == "LeaseLost"
        assert after_a is not None
        assert (
            after_a.state,
            after_a.epoch,
            after_a.readback_ref,
            after_a.write_started_at,
            after_a.last_result,
        ) == ("EXECUTING", 2, None, None, None)

        b_release.set()
        after_b = await asyncio.wait_for(task_b, 10)
    assert seen["b_fence"] is True
    assert after_b is not None
    assert (
        after_b.state,
        after_b.epoch,
        after_b.attempt,
        after_b.stop_reason,
        after_b.readback_ref,
        after_b.last_result,
    ) == ("DONE", 2, 2, "COMPLETED", "from-B", "Done")
    assert after_b.write_started_at is not None
    assert ScriptedAdapter.endings == [(x, "DONE", "COMPLETED")]
    assert [c["epoch"] for c in ScriptedAdapter.calls] == [1, 2]
    warnings = outbox_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("action.end.stale"), warnings
    assert "epoch=1" in warnings[0]


# -- d. kill -9 after the fence ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["TEST_HANG_ONCE", "TEST_HANG_READ"])
def test_a_holder_killed_after_its_fence(rec: OutboxTestDatabase, procs: Procs, kind: str) -> None:
    """At most once: never run again, UNCERTAIN with LEASE_LOST_AFTER_WRITE once the lease is
    over. Read back: reclaimed after the lease, and the next attempt sees write_started."""
    db = rec
    lease = {"lease": 4, "margin": 1, "poll": 0.2}
    first = procs.start(kind, **lease)
    first.wait_ready()
    with db.connect() as conn:
        x = db.outbox.enqueue(conn, ActionRequest(kind, "crash", "crash-1")).id
        conn.commit()
    wait_for(lambda: "fenced" in {e for _, e, _ in records(db, x)}, 10, "the fence")
    os.kill(first.pid, signal.SIGKILL)
    assert first.popen.wait(10) == -signal.SIGKILL
    held = action(db, x)
    assert (held["state"], held["epoch"]) == ("EXECUTING", 1)
    assert held["write_started_at"] is not None
    first_lease = held["lease_until"]

    second = procs.start(kind, **lease)
    second.wait_ready()
    ended = wait_for(
        lambda: (a := action(db, x))["state"] != "EXECUTING" and a, 30, "the action to end"
    )
    assert second.stop() == 0
    assert own_warnings(second.stderr()) == [] or kind == "TEST_HANG_ONCE", second.stderr()
    got = records(db, x)
    if kind == "TEST_HANG_ONCE":
        assert (ended["state"], ended["stop_reason"], ended["epoch"], ended["attempt"]) == (
            "UNCERTAIN",
            "LEASE_LOST_AFTER_WRITE",
            1,
            1,
        )
        assert ended["ended_at"] >= first_lease
        assert got == [(x, "start", first.pid), (x, "fenced", first.pid)]
        # The reaper's end is logged as a warning (action.ended.uncertain), nothing else.
        lines = [line for line in second.stderr().splitlines() if line.strip()]
        assert all("action.ended.uncertain" in line for line in lines), lines
    else:
        assert (
            ended["state"],
            ended["stop_reason"],
            ended["epoch"],
            ended["attempt"],
            ended["readback_ref"],
        ) == ("DONE", "COMPLETED", 2, 2, f"readback-{x}")
        assert got == [
            (x, "start", first.pid),
            (x, "fenced", first.pid),
            (x, "start", second.pid),
            (x, "write_started", second.pid),
            (x, "end", second.pid),
        ]
        reclaimed_at = db.scalar(
            "SELECT min(at) FROM test_record WHERE action_id = %s AND pid = %s", (x, second.pid)
        )
        assert reclaimed_at >= first_lease


# -- e. producers that commit out of id order --------------------------------------------------


def _scripted_order(hold: dict[int, asyncio.Event]) -> list[int]:
    order: list[int] = []

    async def script(attempt: ActionAttempt) -> AdapterResult:
        order.append(attempt.id)
        if attempt.id in hold:
            await hold[attempt.id].wait()
        return Done()

    ScriptedAdapter.script = script
    return order


async def test_an_enqueue_into_a_lane_waits_for_an_uncommitted_enqueue_into_it(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """What happens: the second producer's enqueue blocks on the lane row until the first
    commits (or rolls back), so the two cannot commit out of id order this way."""
    order = _scripted_order({})
    executor = executor_for(db, poll_seconds=0.1, shutdown_seconds=5)
    async with running(executor) as run:
        conn1, conn2 = await db.aconnect(), await db.aconnect()
        async with conn1, conn2:
            x = (await db.outbox.aenqueue(conn1, ActionRequest("TEST_SCRIPTED", "L", "x"))).id

            async def second() -> int:
                y = (await db.outbox.aenqueue(conn2, ActionRequest("TEST_SCRIPTED", "L", "y"))).id
                await conn2.commit()
                return y

            task2 = asyncio.create_task(second())
            await await_for(
                lambda: blocked_on_lock(db, conn2.info.backend_pid),
                10,
                "the second enqueue to wait on the lane's lock",
            )
            await asyncio.sleep(0.5)  # the executor polls a few times meanwhile
            assert not task2.done() and order == []
            await conn1.commit()
            y = await asyncio.wait_for(task2, 10)
        await await_for(
            lambda: ascalar(
                db, "SELECT count(*) = 2 FROM {schema}.agent_action WHERE state = 'DONE'"
            ),
            10,
            "both to end",
        )
        assert not run.done()
    assert x < y and order == [x, y]
    assert outbox_warnings(caplog) == []


async def test_an_action_committed_behind_an_executing_later_id_waits_for_it_then_runs(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """X gets the lower id but commits after Y was claimed: X's INSERT first waits on a third
    transaction that holds X's idempotency key (its id is already drawn), so the lane row is
    free for Y's enqueue. The executor must not claim X beside the executing Y (the unique index
    ux_agent_action_lane_executing), must not fail its claim, and runs X after Y."""
    hold_y = asyncio.Event()
    hold: dict[int, asyncio.Event] = {}
    order = _scripted_order(hold)
    executor = executor_for(db, poll_seconds=0.1, shutdown_seconds=5)
    async with running(executor) as run:
        conn1, conn2, conn3 = await db.aconnect(), await db.aconnect(), await db.aconnect()
        async with conn1, conn2, conn3:
            await db.outbox.aenqueue(conn3, ActionRequest("TEST_SCRIPTED", "M", "x"))
            task1 = asyncio.create_task(
                db.outbox.aenqueue(conn1, ActionRequest("TEST_SCRIPTED", "L", "x"))
            )
            await await_for(
                lambda: blocked_on_lock(db, conn1.info.backend_pid),
                10,
                "X's insert to wait on the key",
            )
            y = (await db.outbox.aenqueue(conn2, ActionRequest("TEST_SCRIPTED", "L", "y"))).id
            hold[y] = hold_y
            await conn2.commit()
            await await_for(lambda: asyncio.sleep(0, y in order), 10, "Y to be claimed")
            await conn3.rollback()
            enqueued_x = await asyncio.wait_for(task1, 10)
            x = enqueued_x.id
            assert enqueued_x.created and x < y
            await asyncio.sleep(0.5)  # X not committed yet; the executor polls meanwhile
            await conn1.commit()
        await asyncio.sleep(0.5)  # X committed, lower id, Y executing: claims see lane L
        lane = await arows(
            db, "SELECT id, state FROM {schema}.agent_action WHERE lane_key = 'L' ORDER BY id"
        )
        assert lane == [(x, "ADMITTED"), (y, "EXECUTING")]
        assert not run.done() and order == [y]
        hold_y.set()
        await await_for(
            lambda: ascalar(
                db,
                "SELECT count(*) = 2 FROM {schema}.agent_action "
                "WHERE lane_key = 'L' AND state = 'DONE'",
            ),
            10,
            "Y, then X, to end",
        )
        assert not run.done()
    assert order == [y, x]
    assert outbox_warnings(caplog) == []


async def test_a_proposal_admitted_behind_an_executing_later_id_waits_for_it_then_runs(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """A proposal holds its lane (a later action waits for it: tests/test_proposals.py), but
    only once it has committed. Proposal X gets the lower id and commits after Y was claimed
    (as in the test above, its INSERT waits on a third transaction that holds its key). X is
    then a PROPOSED action behind the executing Y; admitted, it waits for Y and runs after."""
    hold_y = asyncio.Event()
    hold: dict[int, asyncio.Event] = {}
    order = _scripted_order(hold)
    executor = executor_for(db, poll_seconds=0.1, shutdown_seconds=5)
    async with running(executor) as run:
        conn1, conn2, conn3 = await db.aconnect(), await db.aconnect(), await db.aconnect()
        async with conn1, conn2, conn3:
            await db.outbox.aenqueue(conn3, ActionRequest("TEST_SCRIPTED", "M", "x"))
            task1 = asyncio.create_task(
                db.outbox.aenqueue(conn1, ActionRequest("TEST_SCRIPTED", "L", "x", proposed=True))
            )
            await await_for(
                lambda: blocked_on_lock(db, conn1.info.backend_pid),
                10,
                "X's insert to wait on the key",
            )
            y = (await db.outbox.aenqueue(conn2, ActionRequest("TEST_SCRIPTED", "L", "y"))).id
            hold[y] = hold_y
            await conn2.commit()
            await await_for(lambda: asyncio.sleep(0, y in order), 10, "Y to be claimed")
            await conn3.rollback()
            enqueued_x = await asyncio.wait_for(task1, 10)
            x = enqueued_x.id
            assert enqueued_x.created and x < y
            await conn1.commit()
        with db.connect() as sync_conn:
            assert db.outbox.admit(sync_conn, x)
            sync_conn.commit()
        await asyncio.sleep(0.5)  # X admitted, lower id, Y executing: claims see lane L
        assert order == [y] and not run.done()
        hold_y.set()
        await await_for(
            lambda: ascalar(
                db, "SELECT count(*) = 2 FROM {schema}.agent_action WHERE state = 'DONE'"
            ),
            10,
            "Y, then X, to end",
        )
        assert not run.done()
    assert order == [y, x]
    assert outbox_warnings(caplog) == []


# -- f. a head this build cannot decode holds its lane -----------------------------------------


class NewerAdapter(ActionAdapter):
    """A kind that only a newer build has."""

    kind = "TEST_NEWER"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done("newer")


@pytest.mark.parametrize("head", ["unknown-kind", "unknown-kind-lease-over", "unknown-variant"])
async def test_a_head_this_build_cannot_decode_holds_its_lane(
    db: OutboxTestDatabase, head: str
) -> None:
    db.register_kind(NewerAdapter)
    older = db.registry.copy()
    older.unregister("TEST_NEWER")
    old_outbox = Outbox(schema=db.schema, registry=older, host=db.host, settings=db.settings)
    with db.connect() as conn:
        k0 = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "L", "k0")).id
        if head == "unknown-variant":
            u = db.outbox.enqueue(
                conn,
                ActionRequest("TEST_PAINT", "L", "u", workspace_id="w", payload={"color": "red"}),
            ).id
            conn.execute(
                'UPDATE "outbox".agent_action SET payload = \'{"color": "green"}\' WHERE id = %s',
                (u,),
            )
        else:
            u = db.outbox.enqueue(conn, ActionRequest("TEST_NEWER", "L", "u")).id
        k1 = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "L", "k1")).id
        other = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "M", "other")).id
        conn.commit()

    def states() -> dict[int, tuple[str, int, int]]:
        return {
            row[0]: row[1:]
            for row in db.rows("SELECT id, state, epoch, attempt FROM {schema}.agent_action")
        }

    async with executor_for(db, outbox=old_outbox) as old:
        ran = await old.drain(timeout=20)
        assert ran == 2
        before = states()
        assert before == {
            k0: ("DONE", 1, 1),
            u: ("ADMITTED", 0, 0),
            k1: ("ADMITTED", 0, 0),
            other: ("DONE", 1, 1),
        }
        if head == "unknown-kind-lease-over":
            # A newer replica claimed it and died: its lease is over, but this build neither
            # reclaims nor reaps it.
            db.scalar(
                "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = 1, "
                "attempt = 1, lease_until = now() - interval '1 minute' WHERE id = %s "
                "RETURNING id",
                (u,),
            )
            db.scalar("UPDATE {schema}.action_lane SET next_at = now() RETURNING 1")
        expected = states()
        assert await old.drain(timeout=20) == 0
        assert await old.run_now(k1) is None
        assert states() == expected
        assert db.scalar(
            "SELECT payload IS NOT NULL FROM {schema}.agent_action WHERE id = %s", (u,)
        )
        snapshot = await old.sample_backlog()
        assert snapshot.lanes_blocked == {expected_kind(head): 1}

    if head != "unknown-variant":
        # The newer build ends the foreign head, and then the lane moves on.
        async with executor_for(db) as newer:
            await newer.drain(timeout=20)
        after = states()
        assert after[u][0] == "DONE" and after[k1][0] == "DONE"


def expected_kind(head: str) -> str:
    return "TEST_PAINT" if head == "unknown-variant" else "TEST_NEWER"


def test_the_executor_process_stops_cleanly_on_sigterm(
    rec: OutboxTestDatabase, procs: Procs
) -> None:
    proc = procs.start("TEST_RECORD", poll=0.2)
    proc.wait_ready()
    with rec.connect() as conn:
        x = rec.outbox.enqueue(conn, ActionRequest("TEST_RECORD", "one", "one")).id
        conn.commit()
    wait_for(lambda: action(rec, x)["state"] == "DONE", 15, "the action to end")
    assert proc.stop() == 0
    assert own_warnings(proc.stderr()) == [], proc.stderr()
    assert f"stopped {proc.pid}" in proc.out.read_text()
    assert records(rec, x) == [(x, "start", proc.pid), (x, "end", proc.pid)]


# -- g. idle executor processes, one enqueue at a time -----------------------------------------

WAKE_POLL = 60.0  # jittered to 48-72 s: a start that waited for it cannot pass the deadline


def test_every_single_enqueue_starts_on_a_wake_up_with_several_executor_processes_waiting(
    rec: OutboxTestDatabase, procs: Procs
) -> None:
    """Three idle executor processes, each registered as waiting: fifty actions enqueued one
    at a time, each in a lane of its own and committed once the one before has started. Every
    one starts on the notification of its commit, none at a poll: each is given a quarter of
    the poll. (The hosts' start latency once looked like starts that waited for the poll as
    executors were added: it counted each executor's first start, docs/reliability.md.)"""
    db = rec
    workers = [procs.start("TEST_RECORD", poll=WAKE_POLL, pool_size=2) for _ in range(3)]
    for worker in workers:
        worker.wait_ready()
    # Registered only once, at the start: each must stay so after the actions it runs.
    wait_for(
        lambda: db.scalar("SELECT count(*) FROM {schema}.executor_waiting") >= len(workers),
        30,
        "every executor to register as waiting",
    )
    waits = []
    with db.connect() as producer:
        for i in range(50):
            x = db.outbox.enqueue(producer, ActionRequest("TEST_RECORD", f"one-{i}", f"one-{i}")).id
            producer.commit()
            committed = time.monotonic()
            wait_for(
                lambda x=x: records(db, x),
                WAKE_POLL / 4,
                f"enqueue {i} (action {x}) to start: it waited for a poll",
                interval=0.005,
            )
            waits.append(time.monotonic() - committed)
    for worker in workers:
        assert worker.stop() == 0, worker.stderr()
        assert own_warnings(worker.stderr()) == [], worker.stderr()
    by_pid = Counter(pid for _, event, pid in records(db) if event == "start")
    assert sum(by_pid.values()) == 50
    print(f"starts per process: {dict(by_pid)}; slowest seen after {max(waits) * 1000:.0f} ms")


# -- a core bug: claims beyond a kind's concurrency limit --------------------------------------


async def test_attempts_queued_behind_a_kinds_concurrency_limit_keep_their_attempt(
    db: OutboxTestDatabase,
) -> None:
    """Claims beyond the kind's one slot waited in the executor, claimed (EXECUTING, their
    lease running), for the slot: with a lease shorter than the queue, their fences failed.
    Checked by structure, not by a race with the lease: while an attempt runs, no other action
    of the kind is claimed, except one whose attempt already returned (its ending being
    written)."""
    fenced: list[tuple[int, bool]] = []
    returned: set[int] = set()
    claimed_beside: list[list[int]] = []

    async def script(attempt: ActionAttempt) -> AdapterResult:
        ok = await attempt.fence().begin_write()
        fenced.append((attempt.id, ok))
        executing = await arows(
            db, "SELECT id FROM {schema}.agent_action WHERE state = 'EXECUTING' ORDER BY id"
        )
        claimed_beside.append([i for (i,) in executing if i != attempt.id and i not in returned])
        try:
            if not ok:
                return Abandoned()
            await asyncio.sleep(0.2)  # the provider call
            return Done()
        finally:
            returned.add(attempt.id)

    ScriptedAdapter.script = script
    executor = executor_for(
        db,
        lease_seconds=60,
        fence_margin_seconds=1,
        kind_concurrency={"TEST_SCRIPTED": 1},
        poll_seconds=0.1,
        shutdown_seconds=5,
    )
    async with running(executor):
        await listening(db, 1)
        with db.connect() as conn:
            ids = [
                db.outbox.enqueue(
                    conn, ActionRequest("TEST_SCRIPTED", f"slot-{i}", f"slot-{i}", max_attempts=1)
                ).id
                for i in range(4)
            ]
            conn.commit()
        await await_for(
            lambda: ascalar(
                db,
                "SELECT bool_and(state NOT IN ('ADMITTED', 'EXECUTING')) FROM "
                "{schema}.agent_action",
            ),
            20,
            "every action to end",
        )
    got = {
        row[0]: row[1:]
        for row in db.rows("SELECT id, state, stop_reason FROM {schema}.agent_action")
    }
    print(f"fence answers: {fenced}; endings: {got}")
    assert claimed_beside == [[], [], [], []], "claimed beyond the kind's one slot"
    assert got == {i: ("DONE", "COMPLETED") for i in ids}


async def test_a_kinds_concurrency_limit_bounds_the_attempts_running_at_once(
    db: OutboxTestDatabase,
) -> None:
    running_now = 0
    peak = 0

    async def script(attempt: ActionAttempt) -> AdapterResult:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        try:
            await asyncio.sleep(0.2)  # the provider call
        finally:
            running_now -= 1
        return Done()

    ScriptedAdapter.script = script
    executor = executor_for(
        db, kind_concurrency={"TEST_SCRIPTED": 2}, poll_seconds=0.1, shutdown_seconds=5
    )
    async with running(executor):
        await listening(db, 1)
        with db.connect() as conn:
            db.outbox.enqueue_many(
                conn,
                [ActionRequest("TEST_SCRIPTED", f"cap-{i}", f"cap-{i}") for i in range(10)],
            )
            conn.commit()
        await await_for(
            lambda: ascalar(
                db, "SELECT count(*) = 10 FROM {schema}.agent_action WHERE state = 'DONE'"
            ),
            20,
            "every action to end",
        )
    # Ten lanes could all run at once; the kind's limit lets two.
    assert peak == 2


@pytest.mark.slow
async def test_an_ending_survives_a_dropped_database_connection(
    db: OutboxTestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """An at-most-once attempt that fenced and got Done: a database connection dropped meanwhile
    (a failover, a proxy's idle timeout) must not turn that Done into a lost ending (and, once
    the lease ran out, UNCERTAIN with LEASE_LOST_AFTER_WRITE)."""
    fenced, release = asyncio.Event(), asyncio.Event()

    async def script(attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        fenced.set()
        await release.wait()
        return Done("sent")

    ScriptedAdapter.script = script
    executor = executor_for(db, poll_seconds=0.1, shutdown_seconds=5)
    async with running(executor):
        with db.connect() as conn:
            x = db.outbox.enqueue(conn, ActionRequest("TEST_ONCE", "drop", "drop")).id
            conn.commit()
        await asyncio.wait_for(fenced.wait(), 60)
        killed = await ascalar(
            db,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        assert killed >= 1
        release.set()
        try:
            await await_for(
                lambda: ascalar(
                    db, "SELECT state <> 'EXECUTING' FROM {schema}.agent_action WHERE id = %s", (x,)
                ),
                60,
                "the action to end",
            )
        finally:
            print(f"warnings: {outbox_warnings(caplog)}")
    row = action(db, x)
    assert (row["state"], row["readback_ref"]) == ("DONE", "sent")
