"""The backlog gauges' statements with a million actions pending: server time per statement.

Every executor runs these every `OUTBOX_MAINTENANCE_SECONDS` (10 s), the full counts every
`OUTBOX_BLOCKED_LANES_SECONDS` (60 s). Each statement is run through EXPLAIN ANALYZE (JIT off,
as the executor runs them) a few times after a warm-up; the median execution time is printed,
one JSON line per shape and statement.

    python bench/gauges.py [--shape behind_backoff] [--count 1000000] [--runs 5] [--explain]
                           [--queries OLD_QUERIES_SQL]

`--queries` also times the statements of another build's `sql/queries.sql`, interleaved with
this build's in the same database (for a before/after:
`git show REV:outbox-core/src/outbox_core/sql/queries.sql > /tmp/old.sql`). The time is the
statement's wall time from this client over the local socket (its rows are a few per kind);
`--explain` also prints each plan with EXPLAIN ANALYZE.

Shapes (all of the measured kind, BENCH_NOOP, which the gauges count):
  behind_backoff  10,000 lanes whose heads wait out a retry backoff of an hour, with 99 due
                  actions behind each (the case of issue 21: nothing is due)
  not_due         one action per lane, each in a backoff of an hour
  claimable       one due action per lane (an overloaded system: everything is due)
  hot             one lane: its head executing under a long lease, every other action behind it
  lanes_10k       10,000 lanes, each with its head executing under a long lease and 99 actions
                  behind it (the burn's pending shape of that name: every live action waits)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import Timer, bench_database, emit, log

from outbox_core import live_reads
from outbox_core.executor.maintenance import DUE_LANES_READ
from outbox_core.sqlfiles import parse_named, render

INSERT = (
    "INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key, "
    "idempotency_key, payload, max_attempts, due_at, attempt, last_result) "
)
LANES = (
    "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
    "SELECT lane_key, min(due_at), min(id), 'BENCH_NOOP' FROM outbox.agent_action "
    "WHERE state = 'ADMITTED' GROUP BY lane_key"
)
SHAPES: dict[str, list[str]] = {
    "behind_backoff": [
        INSERT + "SELECT 'BENCH_NOOP', false, true, 'lane-' || (g %% 10000), 'p-' || g, '{}', 5, "
        "CASE WHEN g <= 10000 THEN now() + interval '1 hour' ELSE now() END, "
        "CASE WHEN g <= 10000 THEN 1 ELSE 0 END, CASE WHEN g <= 10000 THEN 'Retry' END "
        "FROM generate_series(1, %(n)s) g",
        # The lane rows as a claim leaves them: each lane looked at again when its head is due.
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT lane_key, now() + interval '1 hour', min(id), 'BENCH_NOOP' "
        "FROM outbox.agent_action GROUP BY lane_key",
    ],
    "not_due": [
        INSERT + "SELECT 'BENCH_NOOP', false, true, 'lane-' || g, 'p-' || g, '{}', 5, "
        "now() + interval '1 hour', 1, 'Retry' FROM generate_series(1, %(n)s) g",
        LANES,
    ],
    "claimable": [
        INSERT + "SELECT 'BENCH_NOOP', false, true, 'lane-' || g, 'p-' || g, '{}', 5, now(), 0, "
        "NULL FROM generate_series(1, %(n)s) g",
        LANES,
    ],
    "hot": [
        INSERT + "SELECT 'BENCH_NOOP', false, true, 'hot', 'p-' || g, '{}', 5, now(), 0, NULL "
        "FROM generate_series(1, %(n)s) g",
        "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, "
        "lease_until = now() + interval '1 day' WHERE idempotency_key = 'p-1'",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT 'hot', now() + interval '1 day', min(id), 'BENCH_NOOP' FROM outbox.agent_action",
    ],
    "lanes_10k": [
        INSERT + "SELECT 'BENCH_NOOP', false, true, 'lane-' || (g %% 10000), 'p-' || g, '{}', 5, "
        "now(), 0, NULL FROM generate_series(1, %(n)s) g",
        "UPDATE outbox.agent_action SET state = 'EXECUTING', epoch = 1, attempt = 1, "
        "lease_until = now() + interval '1 day' "
        "WHERE id IN (SELECT min(id) FROM outbox.agent_action GROUP BY lane_key)",
        "INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind) "
        "SELECT lane_key, now() + interval '1 day', min(id), 'BENCH_NOOP' "
        "FROM outbox.agent_action GROUP BY lane_key",
    ],
}
# The gauges' statements, whichever of them this build has, how often an executor runs each, and
# the row limit it passes.
STATEMENTS = {
    "backlog": ("10 s", None),
    "backlog_due": ("10 s", DUE_LANES_READ),
    "backlog_executing": ("10 s", None),
    "uncertain_counts": ("10 s", None),
    "backlog_counts": ("60 s", None),
    "blocked_lanes": ("60 s", 100_000),
}


def run_statement(
    conn: psycopg.Connection[Any], name: str, sql: str, params: dict[str, Any]
) -> None:
    """One statement as the executor runs it: the counts of a build that reads lane by lane
    (``%(scan)s``) read the table too when the lanes held more than their budget."""
    if name == "backlog_counts" and "scan" in params:
        live_reads.count_live(
            lambda scan, budget: conn.execute(
                sql, {**params, "scan": scan, "budget": budget}
            ).fetchall(),
            params["scan"],
        )
    else:
        conn.execute(sql, params).fetchall()


def measure(args: argparse.Namespace, shape: str) -> None:
    with bench_database() as db:
        outbox = db.outbox
        builds = {"this": outbox.queries}
        if args.queries is not None:
            builds["before"] = parse_named(render(Path(args.queries).read_text(), "outbox"))
        params: dict[str, Any] = outbox.registry.filter().params()
        with psycopg.connect(db.url, autocommit=True) as conn:
            with Timer() as timer:
                for statement in SHAPES[shape]:
                    conn.execute(statement, {"n": args.count})
                conn.execute("VACUUM ANALYZE outbox.agent_action")
                conn.execute("VACUUM ANALYZE outbox.action_lane")
            log(f"{shape}: {args.count:,} rows in {timer.seconds:.1f} s")
            conn.execute("SET jit = off")
            # What the passes over live actions take in a build that reads lanes or the table.
            sized: dict[str, Any] = {}
            if "live_read_sizes" in outbox.queries:  # lanes or the table, as the executor picks
                ((lane_bytes, action_bytes),) = conn.execute(
                    outbox.queries["live_read_sizes"]
                ).fetchall()
                sized["scan"] = live_reads.by_table(lane_bytes, action_bytes)
                sized["budget"] = live_reads.LANE_READ_BUDGET
                log(
                    f"{shape}: the passes over live actions read {'the table' if sized['scan'] else 'lane by lane'}"
                )
            timed = [
                (build, name, period, limit, queries[name])
                for build, queries in builds.items()
                for name, (period, limit) in STATEMENTS.items()
                if name in queries
            ]
            # Run by run, every statement of both builds in turn, so that the machine's load
            # (other work shares it) hits both alike; the first run warms the cache.
            times: dict[tuple[str, str], list[float]] = {}
            for run in range(args.runs + 1):
                for build, name, _, limit, sql in timed:
                    started = time.perf_counter()
                    build_params = {
                        **params,
                        **(sized if "live_read_sizes" in builds[build] else {}),
                    }
                    run_statement(conn, name, sql, {**build_params, "limit": limit})
                    if run:
                        times.setdefault((build, name), []).append(
                            (time.perf_counter() - started) * 1000
                        )
            for build, name, period, limit, sql in timed:
                if args.explain:
                    text = conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS) " + sql,
                        {
                            **params,
                            **(sized if "live_read_sizes" in builds[build] else {}),
                            "limit": limit,
                        },
                    ).fetchall()
                    log(f"-- {shape} {build} {name}\n" + "\n".join(line for (line,) in text))
                runs = times[(build, name)]
                emit(
                    {
                        "shape": shape,
                        "rows": args.count,
                        "build": build,
                        "statement": name,
                        "every": period,
                        "ms": round(statistics.median(runs), 2),
                        "ms_runs": [round(t, 2) for t in runs],
                    }
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--queries", help="also time the statements of this queries.sql")
    args = parser.parse_args()
    for shape in SHAPES if args.shape == "all" else [args.shape]:
        measure(args, shape)


if __name__ == "__main__":
    main()
