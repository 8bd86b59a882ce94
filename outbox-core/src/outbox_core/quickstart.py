"""``outbox quickstart``: a demo kind whose effect a person can see, run end to end.

It appends one line per action to a file (``outbox-quickstart.txt`` in the current folder by
default), enqueues a few dozen actions across a few lanes in one transaction, runs the
executor with a progress bar until every action ended, and prints ``outbox status``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .adapter import ActionAdapter
from .attempt import ActionAttempt
from .executor import Executor
from .outbox import Outbox
from .registry import KindRegistry
from .requests import ActionRequest
from .results import Abandoned, AdapterResult, Done
from .settings import OutboxSettings
from .status import collect_status, print_status
from .variants import ActionVariants

DEMO_KIND = "QUICKSTART_LINE"


class Line(BaseModel):
    """One line of the demo file."""

    text: str


class AppendLine(ActionAdapter):
    """The demo kind: appends its line to a file, fenced like any provider write."""

    kind = DEMO_KIND
    instance_level = True
    target: ClassVar[Path] = Path("outbox-quickstart.txt")

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Line)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        body = attempt.body
        assert isinstance(body, Line)
        if not await attempt.fence().begin_write():
            return Abandoned()
        await asyncio.sleep(0.02)  # a provider takes a moment
        with type(self).target.open("a", encoding="utf-8") as out:
            out.write(f"{body.text}\n")
        return Done(f"{type(self).target}:{attempt.lane_key}")


def run_quickstart(
    url: str, settings: OutboxSettings, *, target: Path, count: int, lanes: int
) -> int:
    """Enqueue ``count`` demo actions over ``lanes`` lanes, run them, print the status table.
    Returns how many ended DONE."""
    console = Console()
    AppendLine.target = target
    registry = KindRegistry()
    registry.register(AppendLine, distribution="outbox-core")
    outbox = Outbox(schema=settings.schema_name, registry=registry, settings=settings)
    with psycopg.connect(url) as conn:
        conn.execute(
            outbox.queries["register_kind"],
            {
                "kind": DEMO_KIND,
                "at_most_once": False,
                "instance_level": True,
                "line": "quickstart",
            },
        )
        run = conn.execute("SELECT to_char(clock_timestamp(), 'YYYYMMDDHH24MISSUS')").fetchone()
        assert run is not None
        requests = [
            ActionRequest(
                DEMO_KIND,
                f"quickstart:lane-{index % lanes}",
                f"quickstart:{run[0]}:{index}",
                payload={"text": f"lane {index % lanes}: action {index // lanes + 1}"},
            )
            for index in range(count)
        ]
        ids = [answer.id for answer in outbox.enqueue_many(conn, requests)]
        conn.commit()
    console.print(f"enqueued {count} actions in {lanes} lanes; their effect: lines in {target}")
    done = asyncio.run(_run(outbox, url, settings, ids, console))
    with psycopg.connect(url) as conn:
        report = collect_status(conn, outbox)
    print_status(report)
    return done


async def _run(
    outbox: Outbox, url: str, settings: OutboxSettings, ids: list[int], console: Console
) -> int:
    stop = asyncio.Event()
    executor = Executor(outbox, url, settings=settings)
    runner = asyncio.create_task(executor.run(stop))
    query = outbox.queries["progress"]
    columns: list[Any] = [
        TextColumn("running"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    done = 0
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("actions", total=len(ids))
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            async with conn:
                for _ in range(600):
                    cursor = await conn.execute(query, {"ids": ids})
                    row = await cursor.fetchone()
                    assert row is not None
                    done, ended = row
                    progress.update(task, completed=ended)
                    if ended >= len(ids) or runner.done():
                        break
                    await asyncio.sleep(0.1)
    finally:
        stop.set()
        await runner
        await executor.close()
    return int(done)
