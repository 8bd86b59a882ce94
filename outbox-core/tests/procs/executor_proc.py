"""One executor process for the concurrency tests (``tests/test_concurrency.py``).

Run by path: ``python executor_proc.py --url URL --kind TEST_RECORD [--lease 300 ...]``. It
registers the one kind in a fresh ``KindRegistry``, runs ``Executor.run`` until SIGTERM (or
SIGINT), then stops cleanly (exit 0). It prints ``ready <pid>`` once its pool is open.

The kinds here record to the table ``test_record`` (which the test creates) with a plain
psycopg connection of their own: never inside ``attempt.transaction()``, never a provider.

- ``TEST_RECORD``: records ``start``, fences, records ``end``, returns ``Done``.
- ``TEST_HANG_READ`` (reads back) and ``TEST_HANG_ONCE`` (at most once): record ``start``;
  when an earlier attempt's write may exist (``attempt.write_started``), record
  ``write_started`` and ``end`` and return ``Done`` (the read-back found the write); else fence,
  record ``fenced`` and hang (the test kills the process with SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import signal
import sys
from typing import Any

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
    KindRegistry,
    Outbox,
    OutboxSettings,
)
from outbox_core.executor import Executor

RECORD_TABLE = """
CREATE TABLE IF NOT EXISTS test_record (
    action_id bigint, lane_key text, seq int, event text,
    at timestamptz DEFAULT clock_timestamp(), pid int)
"""


class Rec(BaseModel):
    n: int = 0


class _Recording(ActionAdapter):
    """Base of the recording kinds: a small pool of its own for the ``test_record`` rows."""

    instance_level = True

    def __init__(
        self, url: str | None = None, *, worker: int | None = None, hold: float = 0.0
    ) -> None:
        self.url = url
        self.worker = worker if worker is not None else os.getpid()
        self.hold = hold
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening: asyncio.Lock | None = None

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Rec)

    async def _recorder(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._pool is None:
                    assert self.url is not None, "a recording adapter needs the database URL"
                    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                        self.url,
                        min_size=1,
                        max_size=2,
                        kwargs={"autocommit": True},
                        open=False,
                        name="test-recorder",
                    )
                    await pool.open(wait=True, timeout=30)
                    self._pool = pool
        return self._pool

    async def record(self, attempt: ActionAttempt, event: str) -> None:
        pool = await self._recorder()
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO test_record (action_id, lane_key, seq, event, pid) "
                "VALUES (%s, %s, %s, %s, %s)",
                (
                    attempt.id,
                    attempt.lane_key,
                    int(attempt.payload.get("n", 0)),
                    event,
                    self.worker,
                ),
            )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class RecordingAdapter(_Recording):
    kind = "TEST_RECORD"

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        await self.record(attempt, "start")
        if self.hold:
            await asyncio.sleep(random.uniform(0, self.hold))
        if not await attempt.fence().begin_write():
            await self.record(attempt, "refused")
            return Abandoned()
        await self.record(attempt, "end")
        return Done(f"rec-{attempt.id}")


class HangReadAdapter(_Recording):
    kind = "TEST_HANG_READ"

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        await self.record(attempt, "start")
        if attempt.write_started:
            await self.record(attempt, "write_started")
            await self.record(attempt, "end")
            return Done(f"readback-{attempt.id}")
        if not await attempt.fence().begin_write():
            await self.record(attempt, "refused")
            return Abandoned()
        await self.record(attempt, "fenced")
        await asyncio.Event().wait()  # until SIGKILL (or the attempt's timeout)
        raise AssertionError("unreachable")


class HangOnceAdapter(HangReadAdapter):
    kind = "TEST_HANG_ONCE"
    at_most_once = True


ADAPTERS: dict[str, type[_Recording]] = {
    adapter.kind: adapter for adapter in (RecordingAdapter, HangReadAdapter, HangOnceAdapter)
}


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", required=True, choices=sorted(ADAPTERS))
    parser.add_argument("--schema", default="outbox")
    parser.add_argument("--lease", type=float, default=300.0)
    parser.add_argument("--margin", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--claim-batch", type=int, default=500)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--shutdown", type=float, default=5.0)
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="TEST_RECORD: a random wait of up to this many seconds per attempt",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"%(asctime)s pid={os.getpid()} %(levelname)s %(message)s",
    )
    adapter_class = ADAPTERS[args.kind]
    registry = KindRegistry()
    registry.register(adapter_class, distribution="(test proc)")
    settings = OutboxSettings(
        schema_name=args.schema,
        lease_seconds=args.lease,
        fence_margin_seconds=args.margin,
        concurrency=args.concurrency,
        claim_batch=args.claim_batch,
        poll_seconds=args.poll,
        pool_size=args.pool_size,
        shutdown_seconds=args.shutdown,
    )
    outbox = Outbox(schema=args.schema, registry=registry, settings=settings)
    adapter = adapter_class(args.url, hold=args.hold)
    executor = Executor(outbox, args.url, settings=settings, adapters={args.kind: adapter})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await executor.open()
        await adapter._recorder()
        print(f"ready {os.getpid()}", flush=True)
        await executor.run(stop)
    finally:
        await executor.close()
        await adapter.close()
    print(f"stopped {os.getpid()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
