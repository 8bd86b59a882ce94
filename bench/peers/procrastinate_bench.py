"""Benchmark procrastinate (a peer of outbox) on a fresh throwaway database.

Run with the peers' virtualenv, never with an outbox environment::

    /opt/peers/bin/python bench/peers/procrastinate_bench.py \\
        --dsn postgresql://postgres@127.0.0.1:5432/postgres --workload burn

Prints one JSON object on stdout (see README.md). procrastinate's async worker only
runs on its psycopg 3 connector (``PsycopgConnector``, a psycopg_pool
``AsyncConnectionPool``), so ``--driver psycopg`` is the only driver.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg
from procrastinate import App, JobContext, PsycopgConnector
from procrastinate.tasks import Task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    LATENCY_WARMUP_S,
    BenchConfig,
    BenchError,
    Countdown,
    DrainTimeout,
    IdRange,
    LatencyProbe,
    Stopwatch,
    bounded,
    build_parser,
    chunks,
    config_from_args,
    enqueue_spaced,
    fresh_database,
    log,
    make_result,
    partial_result,
    run_cli,
    wait_drained,
    wait_handled,
)

SYSTEM = "procrastinate"
DRIVERS = ("psycopg",)
QUEUE = "bench"
OTHER_QUEUE = "bench_other"
TASK_NAME = "bench_noop"
PENDING_CHUNK = 100_000
DELETE_JOBS_CHOICES = ("never", "successful", "always")
MAX_POOL_SIZE = 40  # the server allows 100 connections and is shared

# Best throughput settings found on the 2-core benchmark machine (see README.md).
DEFAULT_WORKERS = 8
DEFAULT_CONCURRENCY = 5
DEFAULT_DELETE_JOBS = "successful"
DEFAULT_POLLING_S = 5.0  # procrastinate default; LISTEN/NOTIFY wakes the worker


@dataclass(frozen=True)
class WorkerSettings:
    """The procrastinate knobs that matter for throughput and latency."""

    workers: int
    concurrency: int
    delete_jobs: str
    listen_notify: bool
    fetch_job_polling_interval_s: float
    pool_max_size: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerSettings:
        """Read the tuning flags added by :func:`add_tuning_args`."""
        return cls(
            workers=args.workers,
            concurrency=args.concurrency,
            delete_jobs=args.delete_jobs,
            listen_notify=not args.no_listen_notify,
            fetch_job_polling_interval_s=args.polling_interval,
            pool_max_size=args.pool_size or default_pool_size(args.workers, args.concurrency),
        )


def default_pool_size(workers: int, concurrency: int) -> int:
    """One connection per running job and per fetch loop, plus one to enqueue; capped."""
    return min(workers * (concurrency + 1) + 1, MAX_POOL_SIZE)


def add_tuning_args(parser: argparse.ArgumentParser) -> None:
    """Flags to try other worker settings than the best ones found."""
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="procrastinate workers run side by side in this process (one shared pool)",
    )
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--delete-jobs", choices=DELETE_JOBS_CHOICES, default=DEFAULT_DELETE_JOBS)
    parser.add_argument("--no-listen-notify", action="store_true")
    parser.add_argument("--polling-interval", type=float, default=DEFAULT_POLLING_S)
    parser.add_argument(
        "--pool-size",
        type=int,
        default=0,
        help=f"connection pool max size (0 = workers * (concurrency + 1) + 1, at most "
        f"{MAX_POOL_SIZE})",
    )


def describe_settings(config: BenchConfig, worker: WorkerSettings) -> dict[str, Any]:
    """The "settings" object of the result: versions, connector, worker knobs."""
    settings: dict[str, Any] = {
        "procrastinate_version": version("procrastinate"),
        "psycopg_version": psycopg.__version__,
        "connector": f"PsycopgConnector (AsyncConnectionPool max_size={worker.pool_max_size})",
        "enqueue_api": enqueue_api(config.workload),
    }
    if config.workload == "latency":
        settings["worker"] = worker_description(worker, workers=1, wait=True)
        settings["latency"] = "perf_counter after defer_async returns -> first line of task"
    if config.workload in ("burn", "burn_pending"):
        settings["worker"] = worker_description(worker, workers=worker.workers, wait=False)
        settings["done_when"] = "task saw n jobs and none of them is todo/doing any more"
        settings["setup"] = "pre-enqueued with batch_defer_async, then ANALYZE + CHECKPOINT"
    if config.workload == "burn_pending":
        settings["pending_placement"] = config.pending_placement
        settings["pending_how"] = pending_description(config.pending_placement)
    return settings


def worker_description(worker: WorkerSettings, workers: int, wait: bool) -> dict[str, Any]:
    """The worker part of the settings object."""
    return {
        "runner": "App.run_worker_async x workers, one process, one event loop",
        **asdict(worker),
        "workers": workers,
        "wait": wait,
    }


def enqueue_api(workload: str) -> str:
    """Which procrastinate call enqueues the jobs of *workload*."""
    if workload == "enqueue_single":
        return "Task.defer_async (autocommit: one call = one transaction)"
    return "Task.batch_defer_async (one statement for the whole batch)"


def pending_description(placement: str) -> str:
    """How the pending jobs are kept away from the measured worker."""
    if placement == "future":
        return f"same queue {QUEUE!r}, scheduled_at = now() + 100 years"
    return f"queue {OTHER_QUEUE!r}, which the worker (queues=[{QUEUE!r}]) does not serve"


# ---------------------------------------------------------------------------
# App, connections, schema
# ---------------------------------------------------------------------------


def build_app(
    dsn: str, worker: WorkerSettings, handled: Countdown, probe: LatencyProbe | None
) -> tuple[App, Task[Any, Any, Any]]:
    """An App with one no-op task that counts handled jobs (and marks latency probes)."""
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=2, max_size=worker.pool_max_size))

    @app.task(name=TASK_NAME, queue=QUEUE, pass_context=True)
    async def noop(context: JobContext) -> None:
        if probe is not None:
            probe.mark_started(context.job.id)
        handled.hit()

    return app, noop


@asynccontextmanager
async def admin_connection(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A plain autocommit connection for set-up and completion checks."""
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


async def scalar(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> int:
    """Run a one-row, one-column integer query."""
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def count_left(conn: psycopg.AsyncConnection[Any], ids: IdRange) -> int:
    """Measured jobs still waiting or running."""
    return await scalar(
        conn,
        "SELECT count(*) FROM procrastinate_jobs "
        "WHERE id BETWEEN %s AND %s AND status IN ('todo', 'doing')",
        ids.first,
        ids.last,
    )


async def count_todo(conn: psycopg.AsyncConnection[Any]) -> int:
    """All jobs in status 'todo' (after a burn: the pending ones only)."""
    return await scalar(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")


# ---------------------------------------------------------------------------
# Enqueue and set-up
# ---------------------------------------------------------------------------


async def defer_many(task: Task[Any, Any, Any], count: int) -> list[int]:
    """Defer *count* no-op jobs with procrastinate's batch API; return their ids."""
    ids = await task.batch_defer_async(*({} for _ in range(count)))
    if len(ids) != count:
        raise BenchError(f"batch defer returned {len(ids)} ids for {count} jobs")
    return ids


async def pre_enqueue(task: Task[Any, Any, Any], count: int) -> IdRange:
    """Untimed set-up: defer *count* no-op jobs in batches; return their id range."""
    ids = IdRange()
    for size in chunks(count):
        ids.extend(await defer_many(task, size))
    if ids.size != count:
        raise BenchError(f"measured ids are not contiguous ({ids}), cannot track completion")
    return ids


async def insert_pending(conn: psycopg.AsyncConnection[Any], count: int, placement: str) -> None:
    """Untimed set-up: insert *count* 'todo' jobs the measured worker must not pick.

    INSERT ... SELECT generate_series into procrastinate's own jobs table, in the row
    format its defer writes (its insert triggers run too: events rows and NOTIFYs).
    """
    if placement == "future":
        query = (
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, scheduled_at) "
            "SELECT %s, %s, '{}'::jsonb, now() + interval '100 years' "
            "FROM generate_series(1, %s)"
        )
        queue = QUEUE
    else:
        query = (
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "SELECT %s, %s, '{}'::jsonb FROM generate_series(1, %s)"
        )
        queue = OTHER_QUEUE
    for size in chunks(count, PENDING_CHUNK):
        await conn.execute(query, (queue, TASK_NAME, size))


async def settle(conn: psycopg.AsyncConnection[Any]) -> None:
    """Fresh planner statistics and a checkpoint, so set-up I/O does not leak into timing."""
    await conn.execute("ANALYZE")
    await conn.execute("CHECKPOINT")


# ---------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------


async def run_worker(app: App, worker: WorkerSettings, *, wait: bool, count: int = 1) -> None:
    """Run *count* workers on the measured queue; ``wait=False`` ones stop once caught up."""
    await asyncio.gather(
        *(
            app.run_worker_async(
                queues=[QUEUE],
                name=f"bench-worker-{index}",
                concurrency=worker.concurrency,
                wait=wait,
                listen_notify=worker.listen_notify,
                fetch_job_polling_interval=worker.fetch_job_polling_interval_s,
                delete_jobs=worker.delete_jobs,
                install_signal_handlers=False,
            )
            for index in range(count)
        )
    )


async def stop_worker(worker_task: asyncio.Task[None], timeout_s: float) -> None:
    """Cancel a ``wait=True`` worker (procrastinate's way to stop it) and wait for it."""
    worker_task.cancel()
    with suppress(asyncio.CancelledError):
        await bounded(worker_task, timeout_s, "worker shutdown")


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


async def bench_enqueue_single(config: BenchConfig, task: Task[Any, Any, Any]) -> float:
    """N jobs, one defer (and transaction) each; return elapsed seconds."""

    async def loop() -> None:
        for _ in range(config.n):
            await task.defer_async()

    clock = Stopwatch()
    await bounded(loop(), config.timeout_s, f"enqueue_single of {config.n} jobs")
    return clock.stop()


async def bench_enqueue_bulk(config: BenchConfig, task: Task[Any, Any, Any]) -> float:
    """N jobs in one batch defer; return elapsed seconds."""
    clock = Stopwatch()
    await bounded(defer_many(task, config.n), config.timeout_s, "enqueue_bulk")
    return clock.stop()


async def bench_burn(
    config: BenchConfig,
    dsn: str,
    app: App,
    task: Task[Any, Any, Any],
    handled: Countdown,
    worker: WorkerSettings,
) -> float:
    """Pre-enqueue N jobs (plus pending ones), then time a ``wait=False`` worker on them.

    The clock runs from just before the worker starts until the database shows every
    measured job finished; the worker stops by itself once the queue is empty.
    """
    pending = config.pending if config.workload == "burn_pending" else 0
    async with admin_connection(dsn) as conn:
        if pending:
            log(f"inserting {pending} pending jobs ({config.pending_placement})")
            await bounded(
                insert_pending(conn, pending, config.pending_placement),
                config.timeout_s,
                "inserting pending jobs",
            )
        log(f"pre-enqueueing {config.n} jobs")
        ids = await bounded(pre_enqueue(task, config.n), config.timeout_s, "pre-enqueue")
        await bounded(settle(conn), config.timeout_s, "ANALYZE/CHECKPOINT")

        log(f"{worker.workers} worker(s) started")
        clock = Stopwatch()
        worker_task = asyncio.create_task(run_worker(app, worker, wait=False, count=worker.workers))
        try:
            await wait_drained(handled, lambda: count_left(conn, ids), config.timeout_s)
            seconds = clock.stop()
            await bounded(worker_task, config.timeout_s, "worker shutdown")
        finally:
            if not worker_task.done():
                await stop_worker(worker_task, config.timeout_s)
        left = await count_todo(conn)
    if left != pending:
        raise BenchError(f"{left} jobs still 'todo', expected {pending}")
    return seconds


async def bench_latency(
    config: BenchConfig,
    app: App,
    task: Task[Any, Any, Any],
    handled: Countdown,
    probe: LatencyProbe,
    worker: WorkerSettings,
) -> list[float]:
    """Idle listening worker; defer N jobs ~20 ms apart; return latencies in ms."""
    worker_task = asyncio.create_task(run_worker(app, worker, wait=True))
    try:
        await task.defer_async()
        await wait_handled(handled, 1, config.timeout_s, "warm-up job")
        await asyncio.sleep(LATENCY_WARMUP_S)
        await bounded(
            enqueue_spaced(task.defer_async, probe, config.n),
            config.timeout_s,
            "latency enqueue loop",
        )
        await bounded(handled.done.wait(), config.timeout_s, "latency jobs")
    finally:
        await stop_worker(worker_task, config.timeout_s)
    return probe.latencies_ms(expected=config.n)


async def run_workload(config: BenchConfig, dsn: str, worker: WorkerSettings) -> dict[str, Any]:
    """Install procrastinate in the fresh database *dsn* and run the selected workload."""
    settings = describe_settings(config, worker)
    is_latency = config.workload == "latency"
    probe = LatencyProbe()
    handled = Countdown(config.n + 1 if is_latency else config.n)  # +1: warm-up job
    app, task = build_app(dsn, worker, handled, probe if is_latency else None)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        if config.workload == "enqueue_single":
            seconds = await bench_enqueue_single(config, task)
        elif config.workload == "enqueue_bulk":
            seconds = await bench_enqueue_bulk(config, task)
        elif config.workload in ("burn", "burn_pending"):
            try:
                seconds = await bench_burn(config, dsn, app, task, handled, worker)
            except DrainTimeout as exc:
                exc.partial = partial_result(
                    system=SYSTEM, config=config, settings=settings, exc=exc
                )
                raise
        else:
            clock = Stopwatch()
            latencies = await bench_latency(config, app, task, handled, probe, worker)
            return make_result(
                system=SYSTEM,
                config=config,
                seconds=clock.stop(),
                settings=settings,
                latencies_ms=latencies,
            )
    return make_result(system=SYSTEM, config=config, seconds=seconds, settings=settings)


async def main() -> dict[str, Any]:
    """Parse the command line, make a fresh database, run, drop the database."""
    # The app lives in __main__ on purpose (one process, task named explicitly); silence
    # procrastinate's warning about that import-path pitfall.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    parser = build_parser(SYSTEM, DRIVERS)
    add_tuning_args(parser)
    config = config_from_args(parser.parse_args())
    worker = WorkerSettings.from_args(config.extra)
    async with fresh_database(config.dsn, SYSTEM, keep=config.keep_db) as dsn:
        return await run_workload(config, dsn, worker)


if __name__ == "__main__":
    run_cli(main)
