"""Where a bulk enqueue's time goes: ``enqueue_many`` of ``--n`` actions over ``--lanes`` lanes,
split into its phases, the median of ``--rounds`` batches:

- validation: the requests checked and their payloads validated against the variants;
- build and adapt: the statement's parameters built, then adapted by psycopg (what
  ``execute`` does with them before it sends);
- statement: the server's time inside the statement (``pg_stat_statements``: run it against a
  cluster of your own that loads it, ``shared_preload_libraries = 'pg_stat_statements'``;
  without it, the wall time of ``execute`` and ``fetchall``);
- round trip: the rest of ``execute`` (sending, the answer, reading the rows);
- commit.

    OUTBOX_BENCH_URL=postgresql://postgres@127.0.0.1:55433/postgres \\
        python bench/profile_enqueue.py [--n 10000] [--lanes 1000] [--rounds 5]

The phases are those of the code of the checkout it runs (``Outbox._prepare_many`` and
``Outbox._many_params``), so the same script measures a build before and after a change.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg
from harness import ADMIN_URL, bench_database, emit, log, median
from psycopg.adapt import PyFormat, Transformer

from outbox_core import ActionRequest, Outbox


def statement_ms(conn: psycopg.Connection[Any]) -> float | None:
    """The server's total time in enqueue_many statements so far (None: no pg_stat_statements),
    read through ``conn``, a connection to the cluster's admin database (the view is there)."""
    try:
        row = conn.execute(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements "
            "WHERE query LIKE '%%-- name: enqueue_many%%' OR query LIKE '%%The bulk form%%'"
        ).fetchone()
    except psycopg.Error:
        conn.rollback()
        return None
    conn.commit()
    return float(row[0]) if row else None


def prepared(outbox: Outbox, requests: list[ActionRequest]) -> Any:
    many = getattr(outbox, "_prepare_many", None)
    if many is not None:
        return many(requests, None)
    return [outbox.prepare(request) for request in requests]  # the build before


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
    batch = prepared(outbox, requests)
    t1 = time.perf_counter()
    params = outbox._many_params(batch)
    t2 = time.perf_counter()
    # What execute() does with them before it sends: adapt each value (psycopg's Transformer).
    names = [name for name in params if f"%({name})" in sql]
    Transformer(conn).dump_sequence([params[name] for name in names], [PyFormat.AUTO] * len(names))
    t3 = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    t4 = time.perf_counter()
    conn.commit()
    t5 = time.perf_counter()
    after = statement_ms(admin)
    assert len(rows) == n
    out = {
        "validation_ms": 1e3 * (t1 - t0),
        "build_ms": 1e3 * (t2 - t1),
        "adapt_ms": 1e3 * (t3 - t2),
        "execute_ms": 1e3 * (t4 - t3),
        "commit_ms": 1e3 * (t5 - t4),
    }
    if before is not None and after is not None:
        out["statement_ms"] = after - before
        # execute() adapts the parameters (again): that part of it is adapt_ms.
        out["round_trip_ms"] = max(0.0, out["execute_ms"] - out["statement_ms"] - out["adapt_ms"])
    # As enqueue_many spends it: the adaptation once, inside execute.
    out["total_ms"] = out["validation_ms"] + out["build_ms"] + out["execute_ms"] + out["commit_ms"]
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
