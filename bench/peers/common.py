"""Shared helpers for the peer benchmarks (procrastinate, pgqueuer).

These scripts run with the peers' own virtualenv (``/opt/peers/bin/python``), never
with an outbox environment, so this module only imports the standard library and
psycopg (installed in that virtualenv).

What lives here: the command line shared by both scripts, the throwaway database
(create, hand over, drop, also on error), timing and deadlines, latency percentiles
and the single JSON line printed on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

T = TypeVar("T")

WORKLOADS: tuple[str, ...] = (
    "enqueue_single",
    "enqueue_bulk",
    "burn",
    "latency",
    "burn_pending",
)
# pgqueuer only: each job posts to a loopback HTTP server (bench/loopback_http.py).
HTTP_WORKLOADS: tuple[str, ...] = ("burn_http",)
DEFAULT_N: dict[str, int] = {
    "enqueue_single": 5_000,
    "enqueue_bulk": 10_000,
    "burn": 100_000,
    "latency": 200,
    "burn_pending": 100_000,
    "burn_http": 50_000,
}
DEFAULT_PENDING = 1_000_000
DEFAULT_TIMEOUT_S = 600.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
PENDING_PLACEMENTS: tuple[str, ...] = ("other_queue", "future")

# Far-future offset used by the "future" placement of pending jobs.
FUTURE_OFFSET_SQL = "interval '100 years'"
# Chunk size for untimed set-up inserts (pre-enqueue before a burn).
SETUP_CHUNK = 10_000
# Spacing between two latency probes, and the idle time before the first one.
LATENCY_SPACING_S = 0.020
LATENCY_WARMUP_S = 0.5


class BenchError(RuntimeError):
    """A benchmark could not complete (timeout, lost jobs, bad argument).

    *partial*, when set, is a result object describing how far the run got; it is
    printed on stdout even though the run fails.
    """

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


class DrainTimeout(BenchError):
    """A burn did not finish in time; *completed* jobs were handled in *seconds*."""

    def __init__(self, message: str, completed: int, seconds: float) -> None:
        super().__init__(message)
        self.completed = completed
        self.seconds = seconds


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Options shared by every peer benchmark, already validated."""

    dsn: str
    workload: str
    n: int
    pending: int
    pending_placement: str
    driver: str
    timeout_s: float
    keep_db: bool
    extra: argparse.Namespace = field(compare=False)


def build_parser(
    system: str, drivers: Sequence[str], workloads: Sequence[str] = WORKLOADS
) -> argparse.ArgumentParser:
    """Return the argument parser shared by both scripts; callers add tuning flags."""
    parser = argparse.ArgumentParser(
        prog=f"{system}_bench.py",
        description=f"Benchmark {system} on a fresh throwaway database; prints one JSON line.",
    )
    parser.add_argument("--dsn", required=True, help="postgresql://user@127.0.0.1:5432/db URL")
    parser.add_argument("--workload", required=True, choices=list(workloads))
    parser.add_argument("--n", type=int, default=None, help="jobs measured (default per workload)")
    parser.add_argument(
        "--pending",
        type=int,
        default=DEFAULT_PENDING,
        help="burn_pending only: jobs already pending that the worker must not pick",
    )
    parser.add_argument(
        "--pending-placement",
        choices=PENDING_PLACEMENTS,
        default="other_queue",
        help="burn_pending only: park pending jobs in another queue or far in the future",
    )
    parser.add_argument("--driver", choices=list(drivers), default=drivers[0])
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds allowed for each phase (set-up, measured run) before failing",
    )
    parser.add_argument(
        "--keep-db", action="store_true", help="debugging: do not drop the database"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Validate the parsed arguments and fill in per-workload defaults."""
    check_local_dsn(args.dsn)
    n = args.n if args.n is not None else DEFAULT_N[args.workload]
    if n < 1 or args.pending < 0 or args.timeout <= 0:
        raise BenchError("--n must be >= 1, --pending >= 0 and --timeout > 0")
    return BenchConfig(
        dsn=args.dsn,
        workload=args.workload,
        n=n,
        pending=args.pending,
        pending_placement=args.pending_placement,
        driver=args.driver,
        timeout_s=args.timeout,
        keep_db=args.keep_db,
        extra=args,
    )


# ---------------------------------------------------------------------------
# Throwaway database
# ---------------------------------------------------------------------------


def check_local_dsn(dsn: str) -> None:
    """Refuse any DSN that is not a postgresql:// URL pointing at this machine."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise BenchError(f"--dsn must be a postgresql:// URL, got scheme {parts.scheme!r}")
    if parts.hostname not in LOCAL_HOSTS:
        raise BenchError(f"--dsn host must be local (127.0.0.1), got {parts.hostname!r}")


def with_database(dsn: str, dbname: str) -> str:
    """Return *dsn* with its database name replaced by *dbname*."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def random_db_name(system: str) -> str:
    """A fresh database name such as ``bench_pgqueuer_3f9a1c2b``."""
    return f"bench_{system}_{secrets.token_hex(4)}"


async def _admin_execute(dsn: str, statement: sql.Composed) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement)


@asynccontextmanager
async def fresh_database(dsn: str, system: str, *, keep: bool = False) -> AsyncIterator[str]:
    """Create ``bench_<system>_<random>`` on the server of *dsn*, yield its DSN, drop it.

    The drop uses ``WITH (FORCE)`` so that connections a failed run left behind do not
    keep the database alive; it runs on success, on error and on cancellation.
    """
    name = random_db_name(system)
    await _admin_execute(dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(dsn, name)
    finally:
        if keep:
            log(f"keeping database {name}")
        else:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            await asyncio.shield(_admin_execute(dsn, drop))


# ---------------------------------------------------------------------------
# Timing, deadlines, progress
# ---------------------------------------------------------------------------


class Stopwatch:
    """Wall-clock timer based on ``time.perf_counter``."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.stopped: float | None = None

    def stop(self) -> float:
        """Freeze the timer and return the elapsed seconds."""
        self.stopped = time.perf_counter()
        return self.seconds

    @property
    def seconds(self) -> float:
        """Elapsed seconds (up to now while running)."""
        end = self.stopped if self.stopped is not None else time.perf_counter()
        return end - self.started


async def bounded(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """Await *awaitable* for at most *seconds*, else raise a clear :class:`BenchError`."""
    try:
        return await asyncio.wait_for(awaitable, timeout=seconds)
    except TimeoutError as exc:
        raise BenchError(f"{what} did not finish within {seconds:.0f} s") from exc


class Countdown:
    """Counts handler calls; lets callers wait for a given count (``done`` = target)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = asyncio.Event()
        self._milestones: dict[int, asyncio.Event] = {target: self.done}

    def hit(self) -> None:
        """Record one handled job."""
        self.count += 1
        if (event := self._milestones.get(self.count)) is not None:
            event.set()

    async def reached(self, count: int) -> None:
        """Return once at least *count* jobs were handled."""
        if self.count >= count:
            return
        await self._milestones.setdefault(count, asyncio.Event()).wait()

    def progress(self) -> str:
        """Human-readable progress for error messages."""
        return f"{self.count}/{self.target} jobs handled"


@dataclass
class IdRange:
    """Smallest and largest id of the measured jobs (ids come from one sequence)."""

    first: int = 0
    last: int = -1

    def extend(self, ids: Sequence[int]) -> None:
        """Widen the range to cover *ids*."""
        if not ids:
            return
        low, high = min(ids), max(ids)
        self.first = low if self.last < self.first else min(self.first, low)
        self.last = max(self.last, high)

    @property
    def size(self) -> int:
        """Number of ids in the range."""
        return self.last - self.first + 1


class LatencyProbe:
    """Enqueue-commit and handler-start timestamps (``perf_counter``) keyed by job id."""

    def __init__(self) -> None:
        self.committed: dict[Hashable, float] = {}
        self.started: dict[Hashable, float] = {}

    def mark_committed(self, key: Hashable) -> None:
        """Record that the job *key* is committed (call right after enqueue returns)."""
        self.committed[key] = time.perf_counter()

    def mark_started(self, key: Hashable) -> None:
        """Record that the handler of job *key* started (first line of the handler)."""
        self.started.setdefault(key, time.perf_counter())

    def latencies_ms(self, expected: int) -> list[float]:
        """Commit-to-start latency (ms) of each probed job; fail unless all *expected* ran."""
        latencies = [
            (self.started[key] - committed) * 1000.0
            for key, committed in self.committed.items()
            if key in self.started
        ]
        if len(latencies) != expected:
            raise BenchError(f"{len(latencies)} of {expected} probed jobs were handled")
        return latencies


async def enqueue_spaced(
    enqueue_one: Callable[[], Awaitable[Hashable]],
    probe: LatencyProbe,
    count: int,
    spacing_s: float = LATENCY_SPACING_S,
) -> None:
    """Enqueue *count* jobs one at a time, ~*spacing_s* apart, marking each commit."""
    next_at = time.perf_counter()
    for _ in range(count):
        key = await enqueue_one()
        probe.mark_committed(key)
        next_at += spacing_s
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


async def wait_handled(handled: Countdown, count: int, timeout_s: float, what: str) -> None:
    """Wait until the handler has seen *count* jobs, for at most *timeout_s*."""
    await bounded(handled.reached(count), timeout_s, what)


async def wait_drained(
    handled: Countdown,
    remaining: Callable[[], Awaitable[int]],
    timeout_s: float,
    poll_s: float = 0.005,
) -> None:
    """Wait until the handler saw every job, then until the database shows none left.

    *remaining* counts the measured jobs not yet acknowledged in the peer's own table;
    it is only polled once the handler count is complete, so polling adds no load
    during the burn itself.
    """

    async def drain() -> None:
        await handled.done.wait()
        # Acks are committed by the peer's own connections: polling its table is the
        # only way to see them, and it starts only after the last handler call.
        while await remaining() > 0:  # noqa: ASYNC110
            await asyncio.sleep(poll_s)

    try:
        await bounded(drain(), timeout_s, f"burn of {handled.target} jobs")
    except BenchError as exc:
        rate = handled.count / timeout_s
        message = f"{exc} ({handled.progress()}, ~{rate:.1f} jobs/s)"
        raise DrainTimeout(message, completed=handled.count, seconds=timeout_s) from exc


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (same definition as numpy's default)."""
    if not values:
        raise BenchError("percentile of an empty sample")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def chunks(total: int, size: int = SETUP_CHUNK) -> list[int]:
    """Split *total* into chunk sizes of at most *size*."""
    return [min(size, total - start) for start in range(0, total, size)]


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def make_result(
    *,
    system: str,
    config: BenchConfig,
    seconds: float,
    settings: dict[str, Any],
    jobs: int | None = None,
    latencies_ms: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Build the result object: rate over *jobs* (default ``n``), latency percentiles."""
    count = config.n if jobs is None else jobs
    result: dict[str, Any] = {
        "system": system,
        "driver": config.driver,
        "workload": config.workload,
        "n": config.n,
        "seconds": round(seconds, 4),
        "rate_per_s": round(count / seconds, 1) if seconds > 0 else None,
    }
    if latencies_ms is not None:
        result["p50_ms"] = round(percentile(latencies_ms, 50), 3)
        result["p99_ms"] = round(percentile(latencies_ms, 99), 3)
        result["max_ms"] = round(max(latencies_ms), 3)
    if config.workload == "burn_pending":
        result["pending"] = config.pending
    result["settings"] = settings
    return result


def partial_result(
    *, system: str, config: BenchConfig, settings: dict[str, Any], exc: DrainTimeout
) -> dict[str, Any]:
    """Result object of a timed-out burn: the rate over the jobs handled in time."""
    result = make_result(
        system=system, config=config, seconds=exc.seconds, settings=settings, jobs=exc.completed
    )
    result["timed_out"] = True
    result["completed"] = exc.completed
    result["error"] = str(exc)
    return result


def emit(result: dict[str, Any]) -> None:
    """Print the one JSON object of this run on stdout."""
    sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    sys.stdout.flush()


def log(message: str) -> None:
    """Progress/diagnostics go to stderr so stdout stays one JSON line."""
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def run_cli(main: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> NoReturn:
    """Run *main*, print its result as JSON and exit 0; on failure exit 1 with a message."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = asyncio.run(main())
    except BenchError as exc:
        log(f"error: {exc}")
        if exc.partial is not None:
            emit(exc.partial)
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
    emit(result)
    sys.exit(0)
