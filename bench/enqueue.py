"""Enqueue throughput beside raw SQL of the same rows into the same table, in the same run,
the systems interleaved:

- single: one transaction per action, one producer (``enqueue`` + commit against a raw
  ``INSERT`` + commit of the same row: one round trip each);
- bulk: ``enqueue_many`` of ``--bulk`` actions over ``--lanes`` lanes against a raw statement
  with the same effects (the insert, the lane upsert, one wake-up, the ids returned), written
  twice: with a text array per column (``unnest``, the usual form) and with the batch as one
  JSON document (the form ``enqueue_many`` uses);
- producers: N connections at once (``--producers``), each its own transaction per action, each
  action the head of a lane of its own (an enqueue that can start work): ``aenqueue`` with no
  executor waiting (no wake-up: the executors are busy), ``aenqueue`` with one waiting (a
  ``NOTIFY`` in every transaction), the raw ``INSERT``, and the raw ``INSERT`` with a
  ``NOTIFY`` in its transaction: PostgreSQL serialises the commits of transactions that
  notified, so this shows what the wake-up costs group commit.

    python bench/enqueue.py [--single 5000] [--bulk 10000] [--lanes 1000] [--rounds 7]
                            [--producers 1,4,16,64] [--producer-actions 4000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from harness import Timer, bench_database, emit, log, median
from psycopg.types.json import Jsonb

from outbox_core import ActionRequest, Outbox

COLUMNS = "kind, at_most_once, instance_level, lane_key, idempotency_key, payload, max_attempts"
RAW_INSERT = (
    f"INSERT INTO outbox.agent_action ({COLUMNS}) VALUES ('BENCH_NOOP', false, true, %s, %s, %s, 5)"
)
RAW_INSERT_NOTIFY = (
    f"WITH a AS (INSERT INTO outbox.agent_action ({COLUMNS}) "
    "VALUES ('BENCH_NOOP', false, true, %s, %s, %s, 5) RETURNING 1) "
    "SELECT pg_notify('outbox_outbox', '') FROM a"
)
# The raw bulk forms: the insert (a key that exists is skipped), each lane's row made or
# lowered once, one wake-up, the new ids returned: enqueue_many's effects, without its checks.
_RAW_BULK_TAIL = """
      ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, lane_key, due_at
), lane AS (
    INSERT INTO outbox.action_lane AS l (lane_key, next_at, head_id, head_kind)
    SELECT lane_key, min(due_at), min(id), 'BENCH_NOOP' FROM new_action GROUP BY lane_key
    ON CONFLICT (lane_key) DO UPDATE
       SET next_at = LEAST(l.next_at, excluded.next_at), head_id = LEAST(l.head_id, excluded.head_id)
)
SELECT id, (SELECT pg_notify('outbox_outbox', '')) FROM new_action
"""
RAW_BULK_ARRAYS = (
    f"WITH new_action AS (INSERT INTO outbox.agent_action ({COLUMNS}) "
    "SELECT 'BENCH_NOOP', false, true, l, k, p, 5 "
    "FROM unnest(%s::text[], %s::text[], %s::jsonb[]) AS t(l, k, p)" + _RAW_BULK_TAIL
)
RAW_BULK_JSON = (
    f"WITH new_action AS (INSERT INTO outbox.agent_action ({COLUMNS}) "
    "SELECT 'BENCH_NOOP', false, true, r->>0, r->>1, r->2, 5 "
    "FROM jsonb_array_elements(%s::jsonb) AS e(r)" + _RAW_BULK_TAIL
)


def request(key: str, i: int, lanes: int) -> ActionRequest:
    return ActionRequest("BENCH_NOOP", f"lane-{i % lanes}", key, payload={"n": i})


def single(conn: psycopg.Connection[Any], outbox: Outbox, n: int, lanes: int) -> dict[str, float]:
    """Outbox and raw in turn, one action each, each timed on its own: the commit's flush is most
    of a round, and here it took from 0.3 to 2 ms within minutes, so blocks of one form (of 250,
    then of 50) caught slow spells the other missed (run-by-run ratios from 0.77 to 1.15).
    ``request`` is built outside the timer, as the raw form's parameters are."""
    seconds = {"outbox": 0.0, "raw": 0.0}
    clock = time.perf_counter
    gc.collect()
    for i in range(n):
        asked = request(f"single-{i}", i, lanes)
        started = clock()
        outbox.enqueue(conn, asked)
        conn.commit()
        seconds["outbox"] += clock() - started
        params = (f"lane-{i % lanes}", f"raw-single-{i}", Jsonb({"n": i}))
        started = clock()
        conn.execute(RAW_INSERT, params)
        conn.commit()
        seconds["raw"] += clock() - started
    return {"single_per_s": n / seconds["outbox"], "raw_single_per_s": n / seconds["raw"]}


def settle(conn: psycopg.Connection[Any]) -> None:
    """Before a timed batch: the heap collected, the dirty pages written (CHECKPOINT)."""
    gc.collect()
    conn.execute("CHECKPOINT")
    conn.commit()


def bulk(
    conn: psycopg.Connection[Any], outbox: Outbox, n: int, lanes: int, rounds: int
) -> dict[str, float]:
    """``rounds`` batches of each form, interleaved; the median batch of each. Every batch is
    timed from its requests (or, for raw SQL, its parameters) to its commit."""
    times: dict[str, list[float]] = {"bulk": [], "raw_bulk": [], "raw_bulk_json": []}
    for r in range(rounds):
        requests = [request(f"bulk-{r}-{i}", i, lanes) for i in range(n)]
        # Each batch starts from a collected heap and a fresh checkpoint (here and below), so
        # that the garbage collector does not walk one form's leftovers on the next form's time,
        # nor a checkpoint that the last batch's WAL set off write out its pages.
        settle(conn)
        with Timer() as timer:
            ids = outbox.enqueue_many(conn, requests)
            conn.commit()
        times["bulk"].append(timer.seconds)
        assert len(ids) == n and all(e.created for e in ids)
        del ids
        settle(conn)
        with Timer() as timer:
            params = (
                [f"lane-{i % lanes}" for i in range(n)],
                [f"raw-bulk-{r}-{i}" for i in range(n)],
                [Jsonb({"n": i}) for i in range(n)],
            )
            rows = conn.execute(RAW_BULK_ARRAYS, params).fetchall()
            conn.commit()
        times["raw_bulk"].append(timer.seconds)
        assert len(rows) == n
        del rows, params
        settle(conn)
        with Timer() as timer:
            doc = json.dumps(
                [[f"lane-{i % lanes}", f"raw-json-{r}-{i}", {"n": i}] for i in range(n)]
            )
            rows = conn.execute(RAW_BULK_JSON, (doc,)).fetchall()
            conn.commit()
        times["raw_bulk_json"].append(timer.seconds)
        assert len(rows) == n
    return {f"{name}_per_s": n / median(seconds) for name, seconds in times.items()}


async def producers(url: str, outbox: Outbox, count: int, n: int, lanes: int) -> dict[str, float]:
    """``count`` connections enqueue ``n`` actions in all, one transaction each: outbox, raw,
    raw with a NOTIFY, one after the other on the same connections."""
    conns = [await psycopg.AsyncConnection.connect(url) for _ in range(count)]
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listener.execute('LISTEN "outbox_outbox"')
    out: dict[str, float] = {}
    serial = itertools.count()
    try:
        # Each action a lane of its own: its enqueue can start work, so it notifies whenever an
        # executor waits (an action behind its lane's head never does).
        async def outbox_one(conn: psycopg.AsyncConnection[Any], i: int) -> None:
            key = f"p{count}-{next(serial)}"
            await outbox.aenqueue(conn, ActionRequest("BENCH_NOOP", key, key, payload={"n": i}))

        async def raw_one(conn: psycopg.AsyncConnection[Any], i: int) -> None:
            key = f"p{count}-raw-{next(serial)}"
            await conn.execute(RAW_INSERT, (key, key, Jsonb({"n": i})))

        async def notify_one(conn: psycopg.AsyncConnection[Any], i: int) -> None:
            key = f"p{count}-notify-{next(serial)}"
            await conn.execute(RAW_INSERT_NOTIFY, (key, key, Jsonb({"n": i})))

        forms: dict[str, Callable[[psycopg.AsyncConnection[Any], int], Awaitable[None]]] = {
            f"producers_{count}": outbox_one,
            f"waiting_producers_{count}": outbox_one,
            f"raw_producers_{count}": raw_one,
            f"raw_notify_producers_{count}": notify_one,
        }
        per = n // count
        for name, one in forms.items():
            # An executor waiting for work, as migration 0016 sees one: a LISTEN connection and
            # its row in executor_waiting (only for the form that measures it).
            waiting = name.startswith("waiting_")
            if waiting:
                await listener.execute(
                    "INSERT INTO outbox.executor_waiting (listener_pid) VALUES (%s)",
                    (listener.info.backend_pid,),
                )

            async def loop(conn: psycopg.AsyncConnection[Any], start: int, one: Any = one) -> None:
                for i in range(start, start + per):
                    await one(conn, i)
                    await conn.commit()

            # The listener reads what arrives, as an executor does: notifications left unread
            # would pile up in the server's queue, which no real executor lets happen.
            stop = asyncio.Event()

            async def drain(stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    async for _ in listener.notifies(timeout=0.2):
                        pass

            reader = asyncio.create_task(drain())
            with Timer() as timer:
                await asyncio.gather(*(loop(conn, k * per) for k, conn in enumerate(conns)))
            out[f"{name}_per_s"] = per * count / timer.seconds
            stop.set()
            await reader
            if waiting:
                await listener.execute("DELETE FROM outbox.executor_waiting")
    finally:
        for conn in conns:
            await conn.close()
        await listener.close()
    return out


def one_run(args: argparse.Namespace) -> dict[str, float]:
    out: dict[str, float] = {}
    with bench_database() as db:
        outbox = db.outbox
        with psycopg.connect(db.url) as conn:
            if args.single:
                out |= single(conn, outbox, args.single, args.lanes)
            if args.bulk:
                out |= bulk(conn, outbox, args.bulk, args.lanes, args.rounds)
        for count in args.producers:
            out |= asyncio.run(producers(db.url, outbox, count, args.producer_actions, args.lanes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--single", type=int, default=5000)
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7, help="bulk batches of each form a run")
    parser.add_argument(
        "--producers",
        type=lambda text: [int(n) for n in text.split(",") if n],
        default=[],
        help="comma-separated connection counts (e.g. 1,4,16,64); none by default",
    )
    parser.add_argument("--producer-actions", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        run = one_run(args)
        log(f"run {index + 1}: " + ", ".join(f"{k}={v:,.0f}" for k, v in run.items()))
        runs.append(run)
    summary = {
        key: {
            "median": median([r[key] for r in runs]),
            "min": min(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in runs[0]
    }
    emit(
        {
            "bench": "enqueue",
            "single": args.single,
            "bulk": args.bulk,
            "lanes": args.lanes,
            "producers": args.producers,
            "runs": runs,
            "summary": summary,
        }
    )


if __name__ == "__main__":
    main()
