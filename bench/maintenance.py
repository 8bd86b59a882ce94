"""Retention, expiry, erasure, the gauges and the operator's reads at a million actions, before
and after the layout of issue 34 (core migrations 20-22): the time of each statement, in a
database of each build with the same rows, and the older build's statements on the new layout
(what an older replica pays while both builds run, docs/rolling-updates.md).

    python bench/maintenance.py [--count 1000000] [--runs 5] [--shapes history,stuck]
        [--before 749498e] [--explain NAME]

Shapes (kind BENCH_NOOP, which every statement here counts):
  history  --count actions enqueued over the last 40 days, one a lane of 10,000, nearly all
           ended a second after they were enqueued (1 in 500 FAILED, 1 in 1,000 UNCERTAIN,
           the rest DONE; half with an expiry, a day after), each an account's (20 actions an
           account); and 20,000 live ones in 2,000 lanes of the last minutes: 500 heads
           executing, the rest due, 200 behind their heads past their expiry. A quarter of the
           ended ones are past the retention of 30 days: the first pass of retention.
  steady   history after retention has deleted what it may: what every later pass reads.
  stuck    steady, plus 100,000 admitted actions enqueued 35 days ago (before the history's
           rows of that day, as their ids say) and due in a week, each in a lane of its own:
           older than the cutoff, live, what retention's walk steps over; and 100,000 lanes
           for the lane-by-lane counts.

Each statement runs in a transaction that is rolled back (the rows stay as they were), JIT off
as the executor runs them; the figure is the median wall time over --runs from this client on
the local socket, after one warm-up. A build's statements are its own queries.sql's; the
before build's come from `git show`. Retention is timed as a whole sweep (what one maintenance
tick runs: the before build's loop of 1,000-row batches, this build's walk), expiry both as the
executor's windowed sweep and as its hourly full one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import ADMIN_URL, emit, log

from outbox_core.sqlfiles import parse_named, render
from outbox_core.testing.database import with_database

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "749498e234ff5bf4849b9f14d29123f448bf41a9"
QUERIES = "outbox-core/src/outbox_core/sql/queries.sql"
KIND = "BENCH_NOOP"
KEEP = 30 * 86400.0
FILTER = {"kinds": [KIND], "paths": [None], "suffixes": [None], "filtered": []}
# Retention's sweep, as each build's executor runs it (executor/maintenance.py of each).
RETENTION_BATCH = 1000
RETENTION_STATEMENTS = 100

HISTORY = [
    "ALTER TABLE outbox.agent_action DISABLE TRIGGER USER",
    # The ids leave a gap of %(gap)s after the %(gap_at)s-th (the stuck shape's actions).
    """INSERT INTO outbox.agent_action (id, kind, at_most_once, instance_level, lane_key,
           idempotency_key, payload, max_attempts, state, attempt, epoch, due_at, expires_at,
           ended_at, stop_reason, last_result, created_at, subject_account_id)
       SELECT g + CASE WHEN g > %(gap_at)s THEN %(gap)s ELSE 0 END,
              'BENCH_NOOP', false, true, 'lane-' || (g %% 10000), 'h-' || g, NULL, 5,
              CASE WHEN g %% 1000 = 0 THEN 'UNCERTAIN' WHEN g %% 500 = 0 THEN 'FAILED'
                   ELSE 'DONE' END,
              1, 1, c, CASE WHEN g %% 2 = 0 THEN c + interval '1 day' END, c + interval '1 second',
              CASE WHEN g %% 1000 = 0 THEN 'WRITE_UNCONFIRMED' WHEN g %% 500 = 0 THEN 'REFUSED'
                   ELSE 'DONE' END,
              CASE WHEN g %% 1000 = 0 THEN 'Uncertain' WHEN g %% 500 = 0 THEN 'Failed'
                   ELSE 'Done' END,
              c, 'acct-' || (g %% 50000)
         FROM generate_series(1, %(n)s) g,
              LATERAL (SELECT now() - interval '40 days' + g * interval '40 days' / %(n)s - interval '10 minutes' AS c) t""",
    """SELECT setval(pg_get_serial_sequence('outbox.agent_action', 'id'),
                     (SELECT max(id) FROM outbox.agent_action))""",
    """INSERT INTO outbox.agent_action (kind, at_most_once, instance_level, lane_key,
           idempotency_key, payload, max_attempts, state, attempt, epoch, due_at, lease_until,
           expires_at, created_at)
       SELECT 'BENCH_NOOP', false, true, 'live-' || (g %% 2000), 'l-' || g, '{}', 5,
              CASE WHEN g <= 500 THEN 'EXECUTING' ELSE 'ADMITTED' END,
              CASE WHEN g <= 500 THEN 1 ELSE 0 END, CASE WHEN g <= 500 THEN 1 ELSE 0 END,
              now(), CASE WHEN g <= 500 THEN now() + interval '1 hour' END,
              CASE WHEN g > 2000 AND g %% 100 = 0 THEN now() - interval '1 minute' END,
              now() - interval '5 minutes'
         FROM generate_series(1, 20000) g""",
    """INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind)
       SELECT lane_key, CASE WHEN bool_or(state = 'EXECUTING') THEN now() + interval '1 hour'
                             ELSE now() END, min(id), 'BENCH_NOOP'
         FROM outbox.agent_action WHERE state IN ('ADMITTED', 'EXECUTING') GROUP BY lane_key""",
]
# What only the new layout has: its tables as its triggers would have kept them.
SIDE_TABLES = [
    "ALTER TABLE outbox.action_executing DISABLE TRIGGER USER",
    """INSERT INTO outbox.action_executing (lane_key, action_id)
       SELECT lane_key, id FROM outbox.agent_action WHERE state = 'EXECUTING'""",
    """INSERT INTO outbox.action_failure (action_id, kind, state, ended_at)
       SELECT id, kind, state, ended_at FROM outbox.agent_action
        WHERE state IN ('FAILED', 'UNCERTAIN')""",
]
STEADY = [
    "DELETE FROM outbox.agent_action WHERE ended_at < now() - interval '30 days'",
]
# In the history's gap: their ids are those of actions enqueued 35 days ago (the history's
# rows of the 40 to 35 days before lie below them).
STUCK = [
    """INSERT INTO outbox.agent_action (id, kind, at_most_once, instance_level, lane_key,
           idempotency_key, payload, max_attempts, due_at, created_at)
       SELECT %(gap_at)s + g, 'BENCH_NOOP', false, true, 'stuck-' || g, 's-' || g, '{}', 5,
              now() + interval '7 days', now() - interval '35 days'
         FROM generate_series(1, %(gap)s) g""",
    """INSERT INTO outbox.action_lane (lane_key, next_at, head_id, head_kind)
       SELECT lane_key, due_at, id, kind FROM outbox.agent_action WHERE lane_key LIKE 'stuck-%%'""",
]
SHAPES = {"history": [], "steady": STEADY, "stuck": STEADY}


def before_source(commit: str) -> tuple[Path, str]:
    """The before build's outbox-core/src (for its migrations) and its queries.sql."""
    target = Path(os.environ.get("TMPDIR", "/tmp")) / f"outbox-before-{commit[:12]}"
    if not target.exists():
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "outbox-core/src"],
            capture_output=True,
            check=True,
        ).stdout
        target.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "outbox-core" / "src", (target / QUERIES).read_text()


def make_database(name: str, src: Path) -> str:
    """A database migrated by the build whose outbox_core is in `src`, with the bench's kind."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(ADMIN_URL, name)
    script = (
        "import sys, psycopg; from outbox_core.migrations import migrate\n"
        "with psycopg.connect(sys.argv[1], autocommit=True) as c: migrate(c, 'outbox', [])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", script, url], env=env, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.action_kind (kind, at_most_once, instance_level, line) "
            "VALUES (%s, false, true, 'bench')",
            (KIND,),
        )
    return url


def fill(url: str, shape: str, count: int, *, side_tables: bool) -> None:
    params = {"n": count, "gap_at": count // 8, "gap": 100_000 if shape == "stuck" else 0}
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in HISTORY + (SIDE_TABLES if side_tables else []):
            conn.execute(statement, params)
        if shape == "stuck":
            for statement in STUCK:
                conn.execute(statement, params)
        for statement in SHAPES[shape]:
            conn.execute(statement)
        if side_tables:
            conn.execute(
                "DELETE FROM outbox.action_failure f WHERE NOT EXISTS "
                "(SELECT 1 FROM outbox.agent_action a WHERE a.id = f.action_id)"
            )
        conn.execute("ALTER TABLE outbox.agent_action ENABLE TRIGGER USER")
        if side_tables:
            conn.execute("ALTER TABLE outbox.action_executing ENABLE TRIGGER USER")
        for table in ("agent_action", "action_lane", "action_executing", "action_failure"):
            if conn.execute("SELECT to_regclass(%s)", (f"outbox.{table}",)).fetchone()[0]:
                conn.execute(f"VACUUM ANALYZE outbox.{table}")
        conn.execute("CHECKPOINT")


def statements(text: str) -> dict[str, str]:
    return {name: render(query, "outbox") for name, query in parse_named(text).items()}


PARAMS: dict[str, Any] = {
    **FILTER,
    "limit": None,
    "keep": KEEP,
    "kind": KIND,
    "after": 0,
    "budget": None,
}
READS = {
    "backlog_due": {"limit": 10_000},
    "backlog_executing": {},
    "uncertain_counts": {},
    "backlog_counts": {},
    "blocked_lanes": {"limit": 100_000},
    "recent_failures": {"limit": 20},
    "retrying_actions": {"limit": 20},
    "dashboard_uncertain": {"limit": 20},
    "dashboard_failures": {},
    "dashboard_state_counts": {},
    "dashboard_throughput": {},
}


def timed(conn: psycopg.Connection[Any], work: Any, runs: int) -> float:
    """Median ms of `work(conn)` in a transaction rolled back each time, after a warm-up."""
    times = []
    for run in range(runs + 1):
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL jit = off")
            started = time.perf_counter()
            work(conn)
            elapsed = time.perf_counter() - started
        if run:
            times.append(elapsed * 1000)
    return round(statistics.median(times), 2)


def retention_sweep(queries: dict[str, str], new: bool, seen: list[tuple[int, int]]) -> Any:
    """One tick of retention as the build's executor runs it; appends (rows deleted,
    statements) to `seen`."""

    def work(conn: psycopg.Connection[Any]) -> None:
        deleted = statements = cursor = 0
        while statements < RETENTION_STATEMENTS:
            statements += 1
            if new:
                params = {"kind": KIND, "after": cursor, "limit": RETENTION_BATCH, "keep": KEEP}
                gone, over, last, _recent = conn.execute(
                    queries["retention_delete"], params
                ).fetchone()  # type: ignore[misc]
                deleted += gone
                if over:
                    break
                cursor = last
            else:
                rows = conn.execute(
                    queries["retention_delete"], {"keep": KEEP, "kinds": [KIND]}
                ).rowcount
                deleted += rows
                if rows < RETENTION_BATCH:
                    break
        seen.append((deleted, statements))

    return work


def erasure(queries: dict[str, str], subject: str) -> Any:
    """The erasure's statements for one account (erasure.py's order), without its catalogs."""

    def work(conn: psycopg.Connection[Any]) -> None:
        lanes = [r[0] for r in conn.execute(queries["lock_subject_lanes"], {"subject": subject})]
        ids = [r[0] for r in conn.execute(queries["lock_subject_actions"], {"subject": subject})]
        conn.execute(queries["erase_actions"], {"ids": ids}).fetchall()
        conn.execute(queries["drop_idle_lanes"], {"lanes": lanes})

    return work


# The passes over every live action, which this build makes lane by lane or over the table
# (outbox_core/live_reads.py): each form is timed, and which one the executor takes.
BOTH_FORMS = ("backlog_counts", "blocked_lanes", "retrying_actions")


def measure(url: str, queries: dict[str, str], new: bool, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        if "live_read_sizes" in queries:
            from outbox_core import live_reads

            sizes = conn.execute(queries["live_read_sizes"]).fetchone()
            out["live_reads_by_table"] = live_reads.by_table(*sizes)  # type: ignore[misc]
        for name, extra in READS.items():
            if name not in queries:
                continue
            query = queries[name]
            params = {**PARAMS, **extra, "scan": out.get("live_reads_by_table", False)}
            if new and name == "backlog_counts":
                # As the executor counts: lane by lane up to its budget, then the table.
                from outbox_core import live_reads

                def chosen(c: Any, q: str = query, p: dict[str, Any] = params) -> None:
                    live_reads.count_live(
                        lambda by_table, budget: c.execute(
                            q, {**p, "scan": by_table, "budget": budget}
                        ).fetchall(),
                        bool(p["scan"]),
                    )

                out[name] = timed(conn, chosen, runs)
            else:
                out[name] = timed(
                    conn, lambda c, q=query, p=params: c.execute(q, p).fetchall(), runs
                )
            if new and name in BOTH_FORMS:
                for form, scan in (("lanes", False), ("table", True)):
                    params = {**PARAMS, **extra, "scan": scan}
                    out[f"{name} ({form})"] = timed(
                        conn, lambda c, q=query, p=params: c.execute(q, p).fetchall(), runs
                    )
        expired = queries["expired_actions"]
        windowed = {**PARAMS, "limit": 500, "since": "now"}
        full = {**PARAMS, "limit": 500, "since": "-infinity"}
        if "%(since)s" in expired:
            with conn.transaction():
                since = conn.execute("SELECT now() - interval '70 seconds'").fetchone()[0]  # type: ignore[index]
            windowed["since"] = since
            out["expired_actions"] = timed(
                conn, lambda c: c.execute(expired, windowed).fetchall(), runs
            )
            out["expired_actions_full"] = timed(
                conn, lambda c: c.execute(expired, full).fetchall(), runs
            )
        else:
            out["expired_actions"] = timed(
                conn, lambda c: c.execute(expired, full).fetchall(), runs
            )
        # A fence batch of the 500 executing actions (each at epoch 1, a lease of an hour).
        fenced = conn.execute(
            "SELECT array_agg(id) FROM outbox.agent_action WHERE lane_key LIKE 'live-%%' "
            "AND lease_until IS NOT NULL"
        ).fetchone()[0]  # type: ignore[index]
        conn.rollback()
        fence = {"ids": fenced, "epochs": [1] * len(fenced), "margin": 60.0}
        out["begin_write_500"] = timed(
            conn, lambda c: c.execute(queries["begin_write"], fence).fetchall(), runs
        )
        seen: list[tuple[int, int]] = []
        out["retention_sweep_ms"] = timed(
            conn, retention_sweep(queries, new, seen), max(1, runs // 2)
        )
        out["retention_sweep_rows_statements"] = list(seen[-1])
        out["erasure_of_one_account"] = timed(conn, erasure(queries, "acct-777"), runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", default="history,steady,stuck")
    parser.add_argument("--before", default=BEFORE)
    args = parser.parse_args()
    old_src, old_text = before_source(args.before)
    old_queries = statements(old_text)
    new_queries = statements((ROOT / QUERIES).read_text())
    new_src = ROOT / "outbox-core" / "src"
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            parser.error(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
        old_url = make_database("outbox_maint_before", old_src)
        new_url = make_database("outbox_maint_after", new_src)
        try:
            log(f"{shape}: filling both databases with {args.count:,} actions")
            fill(old_url, shape, args.count, side_tables=False)
            fill(new_url, shape, args.count, side_tables=True)
            results = {
                "before": measure(old_url, old_queries, False, args.runs),
                "after": measure(new_url, new_queries, True, args.runs),
                "before_on_after": measure(new_url, old_queries, False, args.runs),
            }
        finally:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                for name in ("outbox_maint_before", "outbox_maint_after"):
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for build, figures in results.items():
            emit(
                {
                    "bench": "maintenance",
                    "shape": shape,
                    "count": args.count,
                    "build": build,
                    **figures,
                }
            )
        log(json.dumps({"shape": shape, **results}, indent=1))


if __name__ == "__main__":
    main()
