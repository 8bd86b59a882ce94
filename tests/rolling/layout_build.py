"""One replica of a given build of outbox-core, for the rolling-update test of the core's own
schema (tests/test_rolling_hot_layout.py): the build's ``outbox_core`` package is imported from
``--src`` (put first on sys.path), so an older build runs its own statements against the schema
that a newer build's migrations left.

    python layout_build.py --src DIR --url URL --build NAME migrate
    python layout_build.py --src DIR --url URL --build NAME run --seconds S

``migrate`` applies the build's core migrations. ``run`` runs an executor (its claim loop and
its maintenance loop: expiry, retention, the gauges) for ``--seconds`` (with ``--until-done``:
until no live action is left, or ``--seconds`` have passed), then prints one JSON line: the
attempts it started and every log record of level WARNING or above. Each attempt of
its kind fences, records itself in ``public.layout_record`` and ends Done; an action whose key
ends in ``:slow`` takes a second, so that actions are EXECUTING while the schema changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

KIND = "ROLL_LAYOUT"
RECORD = (
    "CREATE TABLE IF NOT EXISTS public.layout_record (action_id bigint, build text, "
    "epoch bigint, lane_key text, at timestamptz DEFAULT clock_timestamp())"
)


class Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("command", choices=["migrate", "run"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--until-done", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, args.src)

    import psycopg
    from pydantic import BaseModel

    import outbox_core
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
    from outbox_core.migrations import migrate

    if not outbox_core.__file__ or not outbox_core.__file__.startswith(args.src):
        raise SystemExit(f"outbox_core came from {outbox_core.__file__}, not from {args.src}")

    if args.command == "migrate":
        with psycopg.connect(args.url, autocommit=True) as conn:
            applied = migrate(conn, "outbox", [])
        print(json.dumps({"applied": [m.label for m in applied]}))
        return

    class Body(BaseModel):
        n: int = 0

    class Recording(ActionAdapter):
        kind = KIND
        instance_level = True

        @classmethod
        def variants(cls) -> ActionVariants:
            return ActionVariants.one(Body)

        async def execute(self, attempt: ActionAttempt) -> AdapterResult:
            if not await attempt.fence().begin_write():
                return Abandoned()
            async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
                await conn.execute(
                    "INSERT INTO public.layout_record (action_id, build, epoch, lane_key) "
                    "VALUES (%s, %s, %s, %s)",
                    (attempt.id, args.build, attempt.epoch, attempt.lane_key),
                )
            if attempt.idempotency_key.endswith(":slow"):
                await asyncio.sleep(1.0)
            return Done(f"{args.build}-{attempt.id}")

    async def live(url: str) -> int:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM outbox.agent_action "
                "WHERE kind = %s AND state IN ('ADMITTED', 'EXECUTING')",
                (KIND,),
            )
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    registry = KindRegistry()
    registry.register(Recording, distribution="outbox-rolling", version=args.build)
    settings = OutboxSettings(
        schema_name="outbox",
        concurrency=20,
        claim_batch=10,
        poll_seconds=0.2,
        maintenance_seconds=0.3,
        blocked_lanes_seconds=0.5,
        # Ended actions are deleted a second after they end: retention runs while the
        # builds share the schema.
        retention_days=1.0 / 86400,
    )
    collected = Collected()
    logging.getLogger().addHandler(collected)
    outbox = Outbox(schema="outbox", registry=registry, settings=settings)

    async def run() -> int:
        executor = Executor(outbox, args.url, settings=settings)
        stop = asyncio.Event()
        async with executor:
            running = asyncio.create_task(executor.run(stop))
            deadline = asyncio.get_running_loop().time() + args.seconds
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
                if args.until_done and not await live(args.url):
                    break
            stop.set()
            await running
            return executor.attempts.started

    started = asyncio.run(run())
    print(json.dumps({"build": args.build, "started": started, "warnings": collected.records}))


if __name__ == "__main__":
    main()
