"""One replica of build 1 or 2: drains what it can decode, then prints its backlog sample."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from outbox_core import Outbox, OutboxSettings
from outbox_core.executor import Executor
from tests.rolling.builds import registry


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", type=int, required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    os.environ["ROLLING_URL"] = args.url
    settings = OutboxSettings(schema_name="outbox")
    outbox = Outbox(
        schema="outbox", registry=registry(args.build, args.scenario), settings=settings
    )
    async with Executor(outbox, args.url, settings=settings) as executor:
        # Not drain(): that makes leases run out, and this test owns the leases it set.
        for _ in range(5):
            rows, _visited = await executor.claims.claim(100)
            executor.attempts.dispatch(rows)
            await executor.settle()  # the attempts and their endings
        await executor.sweep_expired()
        snapshot = await executor.sample_backlog()
    print(
        json.dumps(
            {"due": snapshot.due, "executing": snapshot.executing, "waiting": snapshot.waiting}
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
