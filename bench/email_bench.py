"""Benchmark the EMAIL kind: N emails through the executor to the loopback SMTP server, with and
without connection reuse.

Run with an environment that has outbox-core and outbox-email[test] installed::

    python bench/email_bench.py                 # 2,000 emails, 3 runs per mode
    python bench/email_bench.py -n 500 --runs 1

Each run: a fresh database cloned from a migrated template, N emails enqueued in one
transaction with ``enqueue_many`` (timed on its own), then one executor drains them all
(default executor settings: concurrency 100; ``max_connections`` SMTP connections). The
figure is messages accepted by the relay per second of drain. The relay is the loopback
``SmtpTestServer`` (aiosmtpd, pure Python) in a process of its own, so it does not share the
client's interpreter lock; on a small machine it is still the slower side, so the figures are a
floor for a real relay. Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

from pydantic import BaseModel

from outbox_core import Outbox, hookimpl
from outbox_core.executor import Executor
from outbox_core.plugins import build_host
from outbox_core.testing.database import build_template, fresh_database
from outbox_email import EmailAdapter, EmailNotice, Mail, NoticeContext, email_request
from outbox_email.testing import SmtpTestServer

ADMIN_URL = os.environ.get("OUTBOX_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = "outbox"


class Receipt(BaseModel):
    order_id: int


class ReceiptNotice(EmailNotice[Receipt]):
    """A typical transactional email: a receipt with a text and an HTML part."""

    name = "receipt"
    event = Receipt

    def prepare(self, event: Receipt, context: NoticeContext) -> Mail:
        return Mail(
            to=f"Customer {event.order_id} <customer{event.order_id}@example.test>",
            subject=f"Your receipt for order {event.order_id}",
            text=f"Thank you for order {event.order_id}.\n" + "Line of the receipt.\n" * 20,
            html=f"<p>Thank you for order <b>{event.order_id}</b>.</p>" + "<p>Line.</p>" * 20,
            headers={"List-Unsubscribe": "<https://example.test/unsubscribe>"},
        )


@hookimpl
def outbox_register_email_notices(register: Any) -> None:
    register(ReceiptNotice())


def serve(pipe: Any) -> None:
    """The relay's process: answers "counts" and "reset", ends on "stop"."""
    with SmtpTestServer() as server:
        pipe.send(server.port)
        while (command := pipe.recv()) != "stop":
            if command == "reset":
                server.reset()
            pipe.send((len(server.messages), server.connections))


class Relay:
    def __enter__(self) -> Relay:
        self.pipe, child = multiprocessing.Pipe()
        self.process = multiprocessing.Process(target=serve, args=(child,), daemon=True)
        self.process.start()
        self.port: int = self.pipe.recv()
        self.settings = SmtpTestServer(port=self.port).settings
        return self

    def ask(self, command: str) -> tuple[int, int]:
        self.pipe.send(command)
        return self.pipe.recv()  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        self.pipe.send("stop")
        self.process.join(10)


async def one_run(
    url: str, outbox: Outbox, relay: Relay, n: int, reuse: bool, connections: int
) -> dict[str, Any]:
    adapter = EmailAdapter(
        relay.settings(reuse_connections=reuse, max_connections=connections),
        notices=outbox.registry.get("EMAIL").adapter.notices,  # type: ignore[attr-defined]
    )
    relay.ask("reset")
    async with Executor(outbox, url, adapters={"EMAIL": adapter}) as executor:
        started = time.perf_counter()
        await executor.drain(timeout=600)
        seconds = time.perf_counter() - started
        await adapter.aclose()
    done, opened = relay.ask("counts")
    if done != n:
        raise SystemExit(f"the relay received {done} messages, expected {n}")
    return {"seconds": seconds, "per_second": n / seconds, "connections": opened}


def enqueue(url: str, outbox: Outbox, n: int) -> float:
    import psycopg

    requests = [
        email_request("receipt", {"order_id": i}, idempotency_key=f"receipt:{i}", outbox=outbox)
        for i in range(n)
    ]
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        outbox.enqueue_many(conn, requests)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="emails per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (median reported)")
    parser.add_argument("--connections", type=int, default=8, help="max SMTP connections")
    args = parser.parse_args()

    host = build_host(extra_plugins=[("bench", sys.modules[__name__])])
    template = build_template(ADMIN_URL, host.migration_lines, SCHEMA)
    outbox = Outbox(schema=SCHEMA, host=host)
    results: dict[str, Any] = {"n": args.n, "runs": args.runs, "max_connections": args.connections}
    with Relay() as relay:
        for mode, reuse in (("reuse", True), ("no_reuse", False)):
            runs = []
            for _ in range(args.runs):
                with fresh_database(ADMIN_URL, template, prefix="outbox_bench") as (url, _name):
                    enqueue_seconds = enqueue(url, outbox, args.n)
                    run = asyncio.run(one_run(url, outbox, relay, args.n, reuse, args.connections))
                    run["enqueue_seconds"] = enqueue_seconds
                    runs.append(run)
            results[mode] = {
                "messages_per_second": statistics.median(r["per_second"] for r in runs),
                "drain_seconds": statistics.median(r["seconds"] for r in runs),
                "enqueue_seconds": statistics.median(r["enqueue_seconds"] for r in runs),
                "smtp_connections": statistics.median(r["connections"] for r in runs),
                "all_runs_per_second": [round(r["per_second"], 1) for r in runs],
            }
            print(
                f"{mode:>8}: {results[mode]['messages_per_second']:8.1f} msg/s "
                f"({args.n} in {results[mode]['drain_seconds']:.2f} s, "
                f"{results[mode]['smtp_connections']} SMTP connections; runs "
                f"{results[mode]['all_runs_per_second']})",
                file=sys.stderr,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
