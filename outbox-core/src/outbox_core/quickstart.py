"""``outbox quickstart``: a demo kind whose effect a person can see, run end to end.

It appends one line per action to a file (``outbox-quickstart.txt`` in the current folder by
default, started afresh each run, with the run's name on its first line), enqueues a few dozen
actions across a few lanes in one transaction, runs the executor with a progress bar until
every action ended, and prints ``outbox status``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .adapter import ActionAdapter
from .attempt import ActionAttempt
from .errors import OutboxError
from .executor import Executor
from .outbox import Outbox
from .registry import KindRegistry
from .requests import ActionRequest
from .results import Abandoned, AdapterResult, Done
from .settings import OutboxSettings
from .status import collect_status, print_status
from .variants import ActionVariants

DEMO_KIND = "QUICKSTART_LINE"
HEADER = "# outbox quickstart"
"""The first line of the demo file: what tells a later run (or ``--clean``) that it is the
quickstart's to replace (or remove)."""


_OLD_LINE = re.compile(r"^lane \d+: action \d+$")


def demo_file_is_ours(target: Path) -> bool:
    """The file does not exist, is empty, or was written by the quickstart."""
    try:
        with target.open(encoding="utf-8") as file:
            first = file.readline()
    except FileNotFoundError:
        return True
    except (OSError, UnicodeDecodeError):
        return False
    # An earlier build's file had no header: its lines alone.
    return first == "" or first.startswith(HEADER) or _OLD_LINE.match(first) is not None


def start_demo_file(target: Path, run: str) -> None:
    """A fresh demo file for this run: a second run does not append to the first one's lines
    (which would read as if every action had run twice). A file that is not the quickstart's
    is refused, and left as it is."""
    if not demo_file_is_ours(target):
        raise OutboxError(
            f"--file {target}: the file exists and was not written by outbox quickstart; pass "
            "another --file (the quickstart starts its file afresh each run)"
        )
    target.write_text(
        f"{HEADER} run {run}: one line per demo action, written by its attempt\n", "utf-8"
    )


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
        start_demo_file(target, run[0])
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
