"""Enqueue throughput: single (one transaction each) and bulk, beside raw psycopg inserts of the
same rows into the same table, in the same run.

    python bench/enqueue.py [--single 5000] [--bulk 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse

import psycopg
from harness import Timer, bench_database, emit, log, median
from psycopg.types.json import Jsonb

from outbox_core import ActionRequest

RAW_INSERT = (
    "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
    "idempotency_key, payload, max_attempts) VALUES (%s, false, true, %s, %s, %s, 5)"
)
RAW_BULK = (
    "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
    "idempotency_key, payload, max_attempts) "
    "SELECT 'BENCH_NOOP', false, true, l, k, p, 5 FROM unnest(%s::text[], %s::text[], %s::jsonb[]) AS t(l, k, p)"
)


def one_run(single: int, bulk: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with bench_database() as db:
        outbox = db.outbox
        with psycopg.connect(db.url) as conn:
            with Timer() as timer:
                for i in range(single):
                    outbox.enqueue(
                        conn,
                        ActionRequest(
                            "BENCH_NOOP", f"lane-{i % 1000}", f"single-{i}", payload={"n": i}
                        ),
                    )
                    conn.commit()
            out["single_per_s"] = single / timer.seconds
            with Timer() as timer:
                for i in range(single):
                    conn.execute(
                        RAW_INSERT,
                        ("BENCH_NOOP", f"lane-{i % 1000}", f"raw-single-{i}", Jsonb({"n": i})),
                    )
                    conn.commit()
            out["raw_single_per_s"] = single / timer.seconds
            requests = [
                ActionRequest("BENCH_NOOP", f"lane-{i % 1000}", f"bulk-{i}", payload={"n": i})
                for i in range(bulk)
            ]
            with Timer() as timer:
                outbox.enqueue_many(conn, requests)
                conn.commit()
            out["bulk_per_s"] = bulk / timer.seconds
            with Timer() as timer:
                conn.execute(
                    RAW_BULK,
                    (
                        [f"lane-{i % 1000}" for i in range(bulk)],
                        [f"raw-bulk-{i}" for i in range(bulk)],
                        [Jsonb({"n": i}) for i in range(bulk)],
                    ),
                )
                conn.commit()
            out["raw_bulk_per_s"] = bulk / timer.seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--single", type=int, default=5000)
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        run = one_run(args.single, args.bulk)
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
            "runs": runs,
            "summary": summary,
        }
    )


if __name__ == "__main__":
    main()
