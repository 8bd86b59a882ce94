"""Shared pieces of outbox's benchmarks: a fresh migrated database, bench kinds, timing."""

from __future__ import annotations

import enum
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from loopback_http import named_processes_cpu_seconds
from pydantic import BaseModel

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
    Failed,
    KindRegistry,
    Outbox,
    OutboxSettings,
    PerLoop,
)
from outbox_core.plugins import build_host
from outbox_core.testing.database import OutboxTestDatabase, build_template, fresh_database

if TYPE_CHECKING:
    import aiohttp

ADMIN_URL = os.environ.get("OUTBOX_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class Job(BaseModel):
    n: int = 0


class BenchNoop(ActionAdapter):
    kind = "BENCH_NOOP"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Job)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class BenchFenced(ActionAdapter):
    kind = "BENCH_FENCED"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Job)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Done()


@contextmanager
def bench_database(**settings: Any) -> Iterator[OutboxTestDatabase]:
    """A fresh database cloned from the migrated template, with the bench kinds registered."""
    host = build_host()
    template = build_template(ADMIN_URL, host.migration_lines, "outbox")
    with fresh_database(ADMIN_URL, template, prefix="outbox_bench") as (url, name):
        db = OutboxTestDatabase(
            url=url, name=name, schema="outbox", host=host, registry=KindRegistry()
        )
        for kind in BENCH_KINDS:
            db.register_kind(kind)
        db.settings = OutboxSettings(schema_name="outbox", **settings)
        yield db


def outbox_for(db: OutboxTestDatabase) -> Outbox:
    return db.outbox


@dataclass
class Timer:
    started: float = 0.0
    seconds: float = 0.0

    def __enter__(self) -> Timer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BenchLatency(ActionAdapter):
    """Notes (action id, wall-clock start); the bench worker writes them out when it stops."""

    kind = "BENCH_LATENCY"
    instance_level = True
    starts: ClassVar[list[tuple[int, float]]] = []

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Job)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        type(self).starts.append((attempt.id, time.time()))
        return Done()


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


class ModeJob(BaseModel):
    mode: Mode = Mode.FAST
    n: int = 0


class BenchFiltered(BenchNoop):
    """BENCH_NOOP with an enum in its payload: its claim evaluates a JSON path (the variant
    filter), where BENCH_NOOP's has none."""

    kind = "BENCH_FILTERED"

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(ModeJob)


class BenchOther(BenchNoop):
    """A kind registered in the database that the measured executor does not serve."""

    kind = "BENCH_OTHER"


HTTP_URL_ENV = "OUTBOX_BENCH_HTTP_URL"


class BenchHttp(ActionAdapter):
    """Posts each action to the loopback provider (`bench/loopback_http.py`, its URL in
    OUTBOX_BENCH_HTTP_URL) and ends it `Done` on a 2xx answer: the work users run. One aiohttp
    session per executor process (per event loop), its connection pool as large as the
    executor's `concurrency`, so that no attempt waits for a connection. No slot limit of its
    own (`max_concurrency` None): the executor's `concurrency` is the number of posts in flight.
    pgqueuer's `burn_http` handler (bench/peers/pgqueuer_bench.py) posts the same body with the
    same client and the same pool."""

    kind = "BENCH_HTTP"
    instance_level = True
    provider_timeout_seconds = 30.0

    def __init__(self, url: str = "", connections: int = 100) -> None:
        self.url = url
        self.connections = connections
        self._session: PerLoop[aiohttp.ClientSession] = PerLoop(self._open, _close_session)

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Job)

    @classmethod
    def build(cls, settings: OutboxSettings) -> Self:
        import aiohttp  # noqa: F401  (imported when an executor builds the adapter)

        return cls(os.environ.get(HTTP_URL_ENV, ""), settings.concurrency)

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.connections),
            timeout=aiohttp.ClientTimeout(total=self.provider_timeout_seconds),
        )

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        body = {"channel": attempt.lane_key, "text": f"message {attempt.id}"}
        async with self._session.get().post(self.url, json=body) as response:
            await response.read()
            if 200 <= response.status < 300:
                return Done()
            return Failed(detail=f"HTTP {response.status}")

    async def aclose(self) -> None:
        await self._session.aclose()


async def _close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


BENCH_KINDS = (BenchNoop, BenchFenced, BenchLatency, BenchOther, BenchFiltered, BenchHttp)


def postgres_cpu_seconds() -> float:
    """CPU time (user + system) of every running `postgres` process on this machine, from /proc.
    Read it before and after a run while the run's connections are still open."""
    return named_processes_cpu_seconds("postgres")
