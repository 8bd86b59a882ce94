"""Benchmark the SLACK_POST kind: N turns through the executor to the loopback Slack Web API.

Run with an environment that has outbox-core and outbox-slack installed::

    python bench/slack_bench.py                 # 2,000 posts, 3 runs
    python bench/slack_bench.py -n 500 --runs 1

Each run: a fresh database cloned from a migrated template, N turns (one entry each) stored and
enqueued with ``post_turn`` in one transaction (timed on its own), spread over 50 channels or
all in one (a channel is a lane: its posts go one at a time), then one executor drains them all
(default executor settings; ``max_connections`` HTTP connections). The figure is posts
recorded by the server per second of drain. The server is the loopback ``SlackTestServer``
(aiohttp) in a process of its own, so it does not share the client's interpreter lock.

A last run (50 channels) under cProfile gives the share of the executor process's time spent in slack_sdk's
own code, in aiohttp (its transport), and in the rest (outbox, psycopg, asyncio). Profiling
slows the run; the shares, not that run's rate, are the figure. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing
import os
import pstats
import statistics
import sys
import time
from typing import Any

import psycopg

from outbox_core import Outbox
from outbox_core.executor import Executor
from outbox_core.plugins import build_host
from outbox_core.testing.database import build_template, fresh_database
from outbox_slack import Entry, SlackPostAdapter, post_turn
from outbox_slack.testing import SlackTestServer

ADMIN_URL = os.environ.get("OUTBOX_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = "outbox"
CHANNELS = [f"C0BENCH{n:02d}" for n in range(50)]


def serve(pipe: Any) -> None:
    """The server's process: answers "count" and "reset", ends on "stop"."""
    with SlackTestServer() as server:
        for channel in CHANNELS:
            server.add_channel(channel)
        pipe.send(server.port)
        while (command := pipe.recv()) != "stop":
            if command == "reset":
                server.posts.clear()
                for channel in server.channels.values():
                    channel.messages.clear()
            pipe.send(len(server.posts))


class Slack:
    def __enter__(self) -> Slack:
        self.pipe, child = multiprocessing.Pipe()
        self.process = multiprocessing.Process(target=serve, args=(child,), daemon=True)
        self.process.start()
        port: int = self.pipe.recv()
        probe = SlackTestServer()
        probe.port = port
        self.settings = probe.settings
        return self

    def ask(self, command: str) -> int:
        self.pipe.send(command)
        return self.pipe.recv()  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        self.pipe.send("stop")
        self.process.join(10)


def enqueue(url: str, outbox: Outbox, n: int, channels: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for i in range(n):
            # A channel is a lane: its posts go one at a time, in order.
            channel = CHANNELS[i % channels]
            entry = Entry(f"q{i}", "question", channel, f"Question {i}: which release has it?")
            post_turn(conn, f"turn-{i}", [entry], workspace_id="W1", outbox=outbox)
    return time.perf_counter() - started


async def one_run(url: str, outbox: Outbox, slack: Slack, n: int, connections: int) -> float:
    adapter = SlackPostAdapter(
        slack.settings(max_connections=connections, request_timeout_seconds=20)
    )
    slack.ask("reset")
    async with Executor(outbox, url, adapters={"SLACK_POST": adapter}) as executor:
        started = time.perf_counter()
        await executor.drain(timeout=900)
        seconds = time.perf_counter() - started
        await adapter.aclose()
    posted = slack.ask("count")
    if posted != n:
        raise SystemExit(f"the server recorded {posted} posts, expected {n}")
    return seconds


def shares(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile)
    total = 0.0
    buckets = {"slack_sdk": 0.0, "aiohttp": 0.0}
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        total += tottime
        for bucket in buckets:
            if f"/{bucket}/" in filename:
                buckets[bucket] += tottime
    return {bucket: round(value / total, 3) for bucket, value in buckets.items()} | {
        "profiled_seconds": round(total, 2)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="posts per run")
    parser.add_argument("--runs", type=int, default=3, help="runs (median reported)")
    parser.add_argument("--connections", type=int, default=10, help="max HTTP connections")
    args = parser.parse_args()

    host = build_host()
    template = build_template(ADMIN_URL, host.migration_lines, SCHEMA)
    outbox = Outbox(schema=SCHEMA, host=host)
    results: dict[str, Any] = {"n": args.n, "runs": args.runs, "max_connections": args.connections}
    with Slack() as slack:
        for channels in (50, 1):
            runs: list[dict[str, float]] = []
            for _ in range(args.runs):
                with fresh_database(ADMIN_URL, template, prefix="outbox_bench") as (url, _name):
                    enqueue_seconds = enqueue(url, outbox, args.n, channels)
                    seconds = asyncio.run(one_run(url, outbox, slack, args.n, args.connections))
                    runs.append({"seconds": seconds, "enqueue_seconds": enqueue_seconds})
            rates = [args.n / run["seconds"] for run in runs]
            results[f"channels_{channels}"] = {
                "posts_per_second": round(statistics.median(rates), 1),
                "all_runs_per_second": [round(rate, 1) for rate in rates],
                "drain_seconds": round(statistics.median(run["seconds"] for run in runs), 2),
                "enqueue_seconds": round(
                    statistics.median(run["enqueue_seconds"] for run in runs), 2
                ),
            }
            print(f"{channels} channels: {results[f'channels_{channels}']}", file=sys.stderr)
        with fresh_database(ADMIN_URL, template, prefix="outbox_bench") as (url, _name):
            enqueue(url, outbox, args.n, 50)
            profile = cProfile.Profile()
            profile.enable()
            asyncio.run(one_run(url, outbox, slack, args.n, args.connections))
            profile.disable()
    results["time_share_50_channels"] = shares(profile)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
