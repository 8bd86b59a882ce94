"""Benchmark pgqueuer (a peer of outbox) on a fresh throwaway database.

Run with the peers' virtualenv, never with an outbox environment::

    /opt/peers/bin/python bench/peers/pgqueuer_bench.py \\
        --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        --workload burn --driver asyncpg

``--workload burn_http --concurrency C --http-latency-ms 5``: each job posts to a loopback
HTTP server (``bench/loopback_http.py``, a process of its own, standard library only) that
answers after the given latency, with one aiohttp session whose pool holds C connections, at
most C jobs picked at once (``max_concurrent_tasks``); aiohttp must be installed in the
peers' virtualenv for it.

Prints one JSON object on stdout (see README.md). Both pgqueuer drivers are measured:
``--driver asyncpg`` (AsyncpgPoolDriver, or AsyncpgDriver with ``--asyncpg-driver
connection``) and
``--driver psycopg`` (PsycopgDriver over a psycopg 3 AsyncConnection in autocommit).
The worker is pgqueuer's ``QueueManager`` (the job consumer of ``PgQueuer``, without
the cron ``SchedulerManager``, which the benchmark has no use for).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import psycopg
from pgqueuer import Job, QueueManager
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver, Driver, PsycopgDriver
from pgqueuer.queries import Queries

if TYPE_CHECKING:
    import aiohttp  # burn_http only; imported when that workload runs

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # bench/: loopback_http
from common import (
    HTTP_WORKLOADS,
    LATENCY_WARMUP_S,
    WORKLOADS,
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
from loopback_http import LoopbackServer, named_processes_cpu_seconds, server_figures

SYSTEM = "pgqueuer"
DRIVERS = ("asyncpg", "psycopg")
ENTRYPOINT = "bench_noop"
HTTP_ENTRYPOINT = "bench_http"
HTTP_TIMEOUT_S = 30.0  # as outbox's BENCH_HTTP adapter
OTHER_ENTRYPOINT = "bench_other"
FAR_FUTURE = timedelta(days=365 * 100)

# Best throughput settings found on the 2-core benchmark machine (see README.md).
DEFAULT_WORKERS = 1
DEFAULT_BATCH_SIZE = 500
DEFAULT_MAX_CONCURRENT = 1000  # 0 = unlimited (pgqueuer's own default)
DEFAULT_ASYNCPG_DRIVER = "pool"
DEFAULT_DEQUEUE_TIMEOUT_S = 30.0  # pgqueuer default; LISTEN/NOTIFY wakes the worker


@dataclass(frozen=True)
class WorkerSettings:
    """The pgqueuer knobs that matter for throughput and latency."""

    workers: int
    batch_size: int
    max_concurrent_tasks: int
    dequeue_timeout_s: float
    asyncpg_pool: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerSettings:
        """Read the tuning flags added by :func:`add_tuning_args`.

        ``burn_http``: the concurrency is ``max_concurrent_tasks``, this worker's cap on jobs
        picked and not yet done (the dequeue query enforces it), the counterpart of outbox's
        ``concurrency``; pgqueuer wants it at least twice the batch size, so the batch is at
        most half of it (500 at most, the best batch of the no-op burn)."""
        batch_size, max_concurrent = args.batch_size, args.max_concurrent_tasks
        if args.workload in HTTP_WORKLOADS:
            if args.concurrency < 2:
                raise BenchError("--concurrency must be at least 2 (pgqueuer: 2 x batch size)")
            max_concurrent = args.concurrency
            batch_size = min(batch_size, args.concurrency // 2)
        return cls(
            workers=args.workers,
            batch_size=batch_size,
            max_concurrent_tasks=max_concurrent,
            dequeue_timeout_s=args.dequeue_timeout,
            asyncpg_pool=args.driver == "asyncpg" and args.asyncpg_driver == "pool",
        )


def add_tuning_args(parser: argparse.ArgumentParser) -> None:
    """Flags to try other worker settings than the best ones found."""
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="QueueManagers run side by side in this process, each with its own connection",
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--max-concurrent-tasks",
        type=int,
        default=DEFAULT_MAX_CONCURRENT,
        help="0 = unlimited; else must be >= 2 * batch size",
    )
    parser.add_argument("--dequeue-timeout", type=float, default=DEFAULT_DEQUEUE_TIMEOUT_S)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=100,
        help="burn_http: jobs in flight (max_concurrent_tasks) and the HTTP pool's connections",
    )
    parser.add_argument(
        "--http-latency-ms",
        type=float,
        default=5.0,
        help="burn_http: the loopback server answers each post after this many ms",
    )
    parser.add_argument(
        "--asyncpg-driver",
        choices=("pool", "connection"),
        default=DEFAULT_ASYNCPG_DRIVER,
        help="asyncpg only: AsyncpgPoolDriver (asyncpg pool) or AsyncpgDriver (one connection)",
    )


def describe_settings(config: BenchConfig, worker: WorkerSettings) -> dict[str, Any]:
    """The "settings" object of the result: versions, driver wiring, worker knobs."""
    settings: dict[str, Any] = {
        "pgqueuer_version": version("pgqueuer"),
        "driver_class": driver_class_name(config.driver, worker.asyncpg_pool),
        "durability": "durable (pgqueuer default, logged tables)",
        "enqueue_api": "Queries.enqueue (autocommit: one statement = one transaction)",
    }
    if config.workload == "enqueue_bulk":
        settings["enqueue_api"] = "Queries.enqueue with lists (one statement for the batch)"
    if config.workload == "latency":
        settings["worker"] = worker_description(worker, workers=1)
        settings["latency"] = "perf_counter after enqueue returns -> first line of handler"
    if config.workload in ("burn", "burn_pending", "burn_http"):
        settings["worker"] = worker_description(worker, workers=worker.workers)
        settings["done_when"] = "handler saw n jobs and their rows are gone from the queue table"
        settings["setup"] = "pre-enqueued with Queries.enqueue lists, then ANALYZE + CHECKPOINT"
    if config.workload == "burn_http":
        settings["http"] = (
            "entrypoint posts JSON to the loopback server with one aiohttp ClientSession, "
            "TCPConnector(limit=concurrency), ClientTimeout(total=30); done on a 2xx answer"
        )
        settings["concurrency"] = config.extra.concurrency
    if config.workload == "burn_pending":
        settings["pending_placement"] = config.pending_placement
        settings["pending_how"] = pending_description(config.pending_placement)
    return settings


def worker_description(worker: WorkerSettings, workers: int) -> dict[str, Any]:
    """The worker part of the settings object."""
    return {
        "runner": "QueueManager.run (continuous mode) x workers, one process, one event loop",
        "listen_notify": True,
        **asdict(worker),
        "workers": workers,
    }


def driver_class_name(driver: str, asyncpg_pool: bool) -> str:
    """Name of the pgqueuer driver class used for *driver*."""
    if driver == "psycopg":
        return "PsycopgDriver"
    return "AsyncpgPoolDriver" if asyncpg_pool else "AsyncpgDriver"


def pending_description(placement: str) -> str:
    """How the pending jobs are kept away from the measured worker."""
    if placement == "future":
        return f"same entrypoint {ENTRYPOINT!r}, execute_after = now() + 100 years"
    return f"entrypoint {OTHER_ENTRYPOINT!r}, which the worker does not register"


# ---------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------


@asynccontextmanager
async def open_driver(dsn: str, driver: str, asyncpg_pool: bool) -> AsyncIterator[Driver]:
    """Open a pgqueuer driver of the requested kind; close its connection(s) on exit."""
    if driver == "psycopg":
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            yield PsycopgDriver(conn)
        finally:
            await conn.close()
    elif asyncpg_pool:
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
        try:
            yield AsyncpgPoolDriver(pool)
        finally:
            await pool.close()
    else:
        aconn = await asyncpg.connect(dsn)
        try:
            yield AsyncpgDriver(aconn)
        finally:
            await aconn.close()


async def count_left(queries: Queries, ids: IdRange) -> int:
    """Measured jobs not yet acknowledged (pgqueuer deletes a job row once it is done)."""
    table = queries.qbe.settings.queue_table
    rows = await queries.driver.fetch(
        f"SELECT count(*) AS n FROM {table} WHERE id BETWEEN $1 AND $2", ids.first, ids.last
    )
    return int(str(rows[0]["n"]))


async def count_all(queries: Queries) -> int:
    """All rows in pgqueuer's queue table."""
    table = queries.qbe.settings.queue_table
    rows = await queries.driver.fetch(f"SELECT count(*) AS n FROM {table}")
    return int(str(rows[0]["n"]))


# ---------------------------------------------------------------------------
# Enqueue and set-up
# ---------------------------------------------------------------------------


async def enqueue_one(queries: Queries) -> int:
    """Enqueue one no-op job in its own transaction; return its id."""
    (job_id,) = await queries.enqueue(ENTRYPOINT, None)
    return int(job_id)


async def enqueue_many(queries: Queries, count: int, entrypoint: str = ENTRYPOINT) -> list[int]:
    """Enqueue *count* no-op jobs in one call of pgqueuer's batch API; return their ids."""
    ids = await queries.enqueue([entrypoint] * count, [None] * count, [0] * count)
    if len(ids) != count:
        raise BenchError(f"batch enqueue returned {len(ids)} ids for {count} jobs")
    return [int(job_id) for job_id in ids]


async def pre_enqueue(queries: Queries, count: int, entrypoint: str = ENTRYPOINT) -> IdRange:
    """Untimed set-up: enqueue *count* no-op jobs in batches; return their id range."""
    ids = IdRange()
    for size in chunks(count):
        ids.extend(await enqueue_many(queries, size, entrypoint))
    if ids.size != count:
        raise BenchError(f"measured ids are not contiguous ({ids}), cannot track completion")
    return ids


async def insert_pending(queries: Queries, count: int, placement: str) -> None:
    """Untimed set-up: insert *count* queued rows the measured worker must not pick.

    One INSERT ... SELECT generate_series into pgqueuer's own queue table, in the row
    format its enqueue writes (status 'queued', priority 0, NULL payload).
    """
    entrypoint = ENTRYPOINT if placement == "future" else OTHER_ENTRYPOINT
    delay = FAR_FUTURE if placement == "future" else timedelta(0)
    table = queries.qbe.settings.queue_table
    await queries.driver.execute(
        f"INSERT INTO {table} (priority, entrypoint, payload, status, execute_after) "
        "SELECT 0, $1::text, NULL, 'queued', now() + $2::interval "
        "FROM generate_series(1, $3::int)",
        entrypoint,
        delay,
        count,
    )


async def settle(queries: Queries) -> None:
    """Fresh planner statistics and a checkpoint, so set-up I/O does not leak into timing."""
    await queries.driver.execute("ANALYZE")
    await queries.driver.execute("CHECKPOINT")


# ---------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------


def build_worker(driver: Driver, handled: Countdown, probe: LatencyProbe | None) -> QueueManager:
    """A QueueManager whose no-op handler counts jobs (and marks latency probes)."""
    qm = QueueManager(Queries(driver))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        if probe is not None:
            probe.mark_started(int(job.id))
        handled.hit()

    return qm


def build_http_worker(
    driver: Driver, handled: Countdown, session: aiohttp.ClientSession, url: str
) -> QueueManager:
    """A QueueManager whose handler posts each job to the loopback server, as outbox's
    BENCH_HTTP adapter does (the same body, client, pool and timeout), and counts it on a 2xx
    answer (else it raises, and pgqueuer logs the job as failed)."""
    qm = QueueManager(Queries(driver))

    @qm.entrypoint(HTTP_ENTRYPOINT)
    async def post(job: Job) -> None:
        body = {"channel": f"mlane{int(job.id) % 10_000}", "text": f"message {job.id}"}
        async with session.post(url, json=body) as response:
            await response.read()
            if not 200 <= response.status < 300:
                raise BenchError(f"HTTP {response.status}")
        handled.hit()

    return qm


async def run_worker(qm: QueueManager, settings: WorkerSettings) -> None:
    """Run the worker until its shutdown event is set."""
    await qm.run(
        batch_size=settings.batch_size,
        max_concurrent_tasks=settings.max_concurrent_tasks or None,
        dequeue_timeout=timedelta(seconds=settings.dequeue_timeout_s),
    )


async def run_workers(managers: list[QueueManager], settings: WorkerSettings) -> None:
    """Run several workers side by side until each one's shutdown event is set."""
    await asyncio.gather(*(run_worker(qm, settings) for qm in managers))


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


async def bench_enqueue_single(config: BenchConfig, queries: Queries) -> float:
    """N jobs, one per call (and per transaction); return elapsed seconds."""

    async def loop() -> None:
        for _ in range(config.n):
            await enqueue_one(queries)

    clock = Stopwatch()
    await bounded(loop(), config.timeout_s, f"enqueue_single of {config.n} jobs")
    return clock.stop()


async def bench_enqueue_bulk(config: BenchConfig, queries: Queries) -> float:
    """N jobs in one batch call; return elapsed seconds."""
    clock = Stopwatch()
    await bounded(enqueue_many(queries, config.n), config.timeout_s, "enqueue_bulk")
    return clock.stop()


async def bench_burn(
    config: BenchConfig, dsn: str, queries: Queries, worker: WorkerSettings
) -> float:
    """Pre-enqueue N jobs (plus pending ones), then time the worker draining them.

    The clock runs from just before the worker starts until the database shows every
    measured job acknowledged; the worker is then stopped (untimed: pgqueuer's
    shutdown waits out its listener and health-check loops).
    """
    pending = config.pending if config.workload == "burn_pending" else 0
    if pending:
        log(f"inserting {pending} pending jobs ({config.pending_placement})")
        await bounded(
            insert_pending(queries, pending, config.pending_placement),
            config.timeout_s,
            "inserting pending jobs",
        )
    log(f"pre-enqueueing {config.n} jobs")
    ids = await bounded(pre_enqueue(queries, config.n), config.timeout_s, "pre-enqueue")
    await bounded(settle(queries), config.timeout_s, "ANALYZE/CHECKPOINT")

    handled = Countdown(config.n)
    async with AsyncExitStack() as stack:
        managers = [
            build_worker(
                await stack.enter_async_context(
                    open_driver(dsn, config.driver, worker.asyncpg_pool)
                ),
                handled,
                probe=None,
            )
            for _ in range(worker.workers)
        ]
        log(f"{len(managers)} worker(s) started")
        clock = Stopwatch()
        worker_task = asyncio.create_task(run_workers(managers, worker))
        try:
            await wait_drained(handled, lambda: count_left(queries, ids), config.timeout_s)
            seconds = clock.stop()
        finally:
            for qm in managers:
                qm.shutdown.set()
            await bounded(worker_task, config.timeout_s, "worker shutdown")
    left = await count_all(queries)
    if left != pending:
        raise BenchError(f"{left} rows left in the queue table, expected {pending}")
    return seconds


async def bench_burn_http(
    config: BenchConfig, dsn: str, queries: Queries, worker: WorkerSettings
) -> tuple[float, dict[str, Any]]:
    """Pre-enqueue N jobs, then time one worker posting each to the loopback server until the
    database shows every job acknowledged. Returns the seconds and the CPU figures of the timed
    window: this process (the worker; nothing else runs in it meanwhile but the done-check
    after the last handler call), every PostgreSQL process, and the loopback server."""
    import aiohttp

    latency_ms = config.extra.http_latency_ms
    with LoopbackServer(latency_ms) as loopback:
        log(f"pre-enqueueing {config.n} jobs")
        ids = await bounded(
            pre_enqueue(queries, config.n, HTTP_ENTRYPOINT), config.timeout_s, "pre-enqueue"
        )
        await bounded(settle(queries), config.timeout_s, "ANALYZE/CHECKPOINT")
        handled = Countdown(config.n)
        async with (
            open_driver(dsn, config.driver, worker.asyncpg_pool) as driver,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=worker.max_concurrent_tasks),
                timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S),
            ) as session,
        ):
            qm = build_http_worker(driver, handled, session, loopback.url)
            cpu = (time.process_time(), named_processes_cpu_seconds("postgres"))
            loopback_before = loopback.cpu_seconds()
            clock = Stopwatch()
            worker_task = asyncio.create_task(run_worker(qm, worker))
            try:
                await wait_drained(handled, lambda: count_left(queries, ids), config.timeout_s)
                seconds = clock.stop()
                worker_cpu = time.process_time() - cpu[0]
                server_cpu = named_processes_cpu_seconds("postgres") - cpu[1]
                loopback_cpu = loopback.cpu_seconds() - loopback_before
            finally:
                qm.shutdown.set()
                await bounded(worker_task, config.timeout_s, "worker shutdown")
    left = await count_all(queries)
    if left != 0:
        raise BenchError(f"{left} rows left in the queue table, expected 0")
    n = config.n
    figures = {
        "worker_cpu_us_per_action": round(worker_cpu / n * 1e6, 1),
        "worker_core_share": round(worker_cpu / seconds, 3),
        "server_cpu_us_per_action": round(server_cpu / n * 1e6, 1),
        "server_core_share": round(server_cpu / seconds, 3),
        "http": {
            "latency_ms": latency_ms,
            "loopback": server_figures(loopback.report, loopback_cpu, seconds, n),
        },
    }
    return seconds, figures


async def bench_latency(
    config: BenchConfig, dsn: str, queries: Queries, worker: WorkerSettings
) -> list[float]:
    """Idle listening worker; enqueue N jobs ~20 ms apart; return latencies in ms."""
    probe = LatencyProbe()
    handled = Countdown(config.n + 1)  # +1: the warm-up job
    async with open_driver(dsn, config.driver, worker.asyncpg_pool) as driver:
        qm = build_worker(driver, handled, probe)
        worker_task = asyncio.create_task(run_worker(qm, worker))
        try:
            await enqueue_one(queries)
            await wait_handled(handled, 1, config.timeout_s, "warm-up job")
            await asyncio.sleep(LATENCY_WARMUP_S)
            await bounded(
                enqueue_spaced(lambda: enqueue_one(queries), probe, config.n),
                config.timeout_s,
                "latency enqueue loop",
            )
            await bounded(handled.done.wait(), config.timeout_s, "latency jobs")
        finally:
            qm.shutdown.set()
            await bounded(worker_task, config.timeout_s, "worker shutdown")
    return probe.latencies_ms(expected=config.n)


async def run_workload(config: BenchConfig, dsn: str, worker: WorkerSettings) -> dict[str, Any]:
    """Install pgqueuer in the fresh database *dsn* and run the selected workload."""
    settings = describe_settings(config, worker)
    async with open_driver(dsn, config.driver, worker.asyncpg_pool) as driver:
        queries = Queries(driver)
        await queries.install()
        if config.workload == "enqueue_single":
            seconds = await bench_enqueue_single(config, queries)
        elif config.workload == "enqueue_bulk":
            seconds = await bench_enqueue_bulk(config, queries)
        elif config.workload == "burn_http":
            seconds, figures = await bench_burn_http(config, dsn, queries, worker)
            result = make_result(system=SYSTEM, config=config, seconds=seconds, settings=settings)
            return {**result, **figures}
        elif config.workload in ("burn", "burn_pending"):
            try:
                seconds = await bench_burn(config, dsn, queries, worker)
            except DrainTimeout as exc:
                exc.partial = partial_result(
                    system=SYSTEM, config=config, settings=settings, exc=exc
                )
                raise
        else:
            clock = Stopwatch()
            latencies = await bench_latency(config, dsn, queries, worker)
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
    parser = build_parser(SYSTEM, DRIVERS, (*WORKLOADS, *HTTP_WORKLOADS))
    add_tuning_args(parser)
    config = config_from_args(parser.parse_args())
    worker = WorkerSettings.from_args(config.extra)
    async with fresh_database(config.dsn, SYSTEM, keep=config.keep_db) as dsn:
        return await run_workload(config, dsn, worker)


if __name__ == "__main__":
    run_cli(main)
