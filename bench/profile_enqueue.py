"""Where a bulk enqueue's time goes: ``enqueue_many`` of ``--n`` actions over ``--lanes`` lanes,
split into its phases, the median of ``--rounds`` batches:

- validation: the requests checked and their payloads validated against the variants
  (``prepare_batch``), the batch's keys counted (``distinct_keys``);
- build and adapt: the statement's JSON document built (``batch_document``), then adapted by
  psycopg (the JSON encoder psycopg is configured with, what ``execute`` does before it sends);
- statement: the server's time inside the statement (``pg_stat_statements``: run it against a
  cluster of your own that loads it, ``shared_preload_libraries = 'pg_stat_statements'``;
  without it, the wall time of ``execute`` and ``fetchall``);
- round trip: the rest of ``execute`` (sending, the answer, reading it);
- answers: the ``Enqueued`` of each request (``batch_answers``);
- commit.

    OUTBOX_BENCH_URL=postgresql://postgres@127.0.0.1:55433/postgres \\
        python bench/profile_enqueue.py [--n 10000] [--lanes 1000] [--rounds 5]

The phases are those of this checkout's code (``outbox_core.enqueue_rows``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg
from harness import ADMIN_URL, bench_database, emit, log, median
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.json import Jsonb

from outbox_core import ActionRequest, Outbox
from outbox_core.enqueue_rows import batch_answers, batch_document, distinct_keys, prepare_batch


def statement_ms(conn: psycopg.Connection[Any]) -> float | None:
    """The server's total time in enqueue_many statements so far (None: no pg_stat_statements),
    read through ``conn``, a connection to the cluster's admin database (the view is there)."""
    try:
        row = conn.execute(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements "
            "WHERE query LIKE '-- enqueue_many%%' OR query LIKE '%%-- name: enqueue_many%%' OR query LIKE '%%The bulk form%%'"
        ).fetchone()
    except psycopg.Error:
        conn.rollback()
        return None
    conn.commit()
    return float(row[0]) if row else None


def one_batch(
    conn: psycopg.Connection[Any],
    admin: psycopg.Connection[Any],
    outbox: Outbox,
    tag: str,
    n: int,
    lanes: int,
) -> dict[str, float]:
    requests = [
        ActionRequest("BENCH_NOOP", f"lane-{i % lanes}", f"{tag}-{i}", payload={"n": i})
        for i in range(n)
    ]
    sql = outbox.queries["enqueue_many"]
    before = statement_ms(admin)
    t0 = time.perf_counter()
    batch = prepare_batch(outbox.registry, requests, None, outbox.settings.retention_days)
    distinct = distinct_keys(batch)
    t1 = time.perf_counter()
    document = batch_document(batch)
    t2 = time.perf_counter()
    # What execute() does with it before it sends: the JSON encoder psycopg is configured with.
    adapted = Transformer(conn).dump_sequence([Jsonb(document)], [PyFormat.AUTO])
    t3 = time.perf_counter()
    # The document already dumped, so that execute() does not dump it again.
    dumped = bytes(adapted[0]).decode()
    params: dict[str, Any] = {"batch": Jsonb(dumped, dumps=lambda text: text)}
    params["trace_context"] = None
    rows = conn.execute(sql, params).fetchall()
    t4 = time.perf_counter()
    answers = batch_answers(requests, rows[0][0], None)
    t5 = time.perf_counter()
    conn.commit()
    t6 = time.perf_counter()
    after = statement_ms(admin)
    assert len(answers) == n and len(rows[0][0]) == distinct
    out = {
        "validation_ms": 1e3 * (t1 - t0),
        "build_ms": 1e3 * (t2 - t1),
        "adapt_ms": 1e3 * (t3 - t2),
        "execute_ms": 1e3 * (t4 - t3),
        "answers_ms": 1e3 * (t5 - t4),
        "commit_ms": 1e3 * (t6 - t5),
    }
    if before is not None and after is not None:
        out["statement_ms"] = after - before
        out["round_trip_ms"] = max(0.0, out["execute_ms"] - out["statement_ms"])
    out["total_ms"] = sum(
        out[key]
        for key in (
            "validation_ms",
            "build_ms",
            "adapt_ms",
            "execute_ms",
            "answers_ms",
            "commit_ms",
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with (
        bench_database() as db,
        psycopg.connect(db.url) as conn,
        psycopg.connect(ADMIN_URL) as admin,
    ):
        one_batch(conn, admin, db.outbox, "warm", args.n, args.lanes)
        batches = [
            one_batch(conn, admin, db.outbox, f"b{r}", args.n, args.lanes)
            for r in range(args.rounds)
        ]
    summary = {key: median([b[key] for b in batches]) for key in batches[0]}
    log(", ".join(f"{key} {value:.1f}" for key, value in summary.items()))
    emit(
        {
            "bench": "profile_enqueue",
            "n": args.n,
            "lanes": args.lanes,
            "batches": batches,
            "summary": summary,
        }
    )


if __name__ == "__main__":
    main()
