"""`outbox actions` (outbox_core.search) on a large table: each filter's first page, its time and
the buffers its statements touched, with and without the search's indexes (migration 0019).

    python bench/search.py [--count 1000000] [--runs 5] [--explain] [--no-compare]
    python bench/search.py --write-cost 7 [--count 1000000] [--batch 5000]
    python bench/search.py --matching [--count 1000000] [--runs 5]

The table is built with generate_series in a fresh bench database: ``--count`` actions over 30
days (one every few seconds), 90 % DONE, 8 % ADMITTED, 1 % FAILED, 1 % CANCELLED and 0.1 %
UNCERTAIN; four kinds (one of them rare: 0.1 %), 10,000 lanes, 1,000 workspaces, a subject on
one action in three, keys ``report:<n % 50,000>:<n>``. The rows are inserted as they stand
(the lifecycle trigger off for the load), then VACUUM ANALYZE.

Each filter's first page (50 actions) is run through find_steps: every statement it sends is
run once under EXPLAIN (ANALYZE, BUFFERS) for its buffers (shared hit + read, summed over the
page's statements) and plan, and the page is timed ``--runs`` times after a warm-up (the
median, wall time from this client over the local socket, JIT off). Then, unless
``--no-compare``, the indexes of migration 0019 are dropped and every filter is measured again.
One JSON line per filter and build.

``--write-cost ROUNDS``: what the indexes cost the writers instead. Two databases get the same
table, one of them without migration 0019's indexes; then, round by round in turn (the
machine's load hits both alike), ``enqueue_many`` of ``--batch`` new actions (new lanes and
keys, one transaction) in each; the median time per action of each, one JSON line.

``--matching``: what the bulk forms of ``outbox resolve`` and ``outbox retry`` read before they
change anything: ``amatching_ids`` with their bound (1,000) for the states each acts on, with
and without an indexed field; the median wall time of ``--runs``, the ids found, and the
statements (pages) it took.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from datetime import timedelta
from typing import Any

import psycopg
from harness import Timer, bench_database, emit, log

from outbox_core import ActionRequest
from outbox_core.search import ActionFilter, Page, find_steps
from outbox_core.steps import Query, run

LOAD = """
INSERT INTO outbox.agent_action
       (kind, at_most_once, instance_level, workspace_id, lane_key, idempotency_key, payload,
        subject_account_id, state, attempt, max_attempts, epoch, ended_at, stop_reason,
        created_at, due_at)
SELECT k.kind, k.at_most_once, k.instance_level, 'ws-' || (g %% 1000), 'lane-' || (g %% 10000),
       'report:' || (g %% 50000) || ':' || g,
       CASE WHEN s.state IN ('ADMITTED') THEN '{}'::jsonb END,
       CASE WHEN g %% 3 = 0 THEN 'acct-' || (g %% 100000) END,
       s.state, 1, 5, 1,
       CASE WHEN s.state <> 'ADMITTED' THEN t.at + interval '2 seconds' END,
       CASE s.state WHEN 'DONE' THEN 'COMPLETED' WHEN 'FAILED' THEN 'ATTEMPTS_EXHAUSTED'
                    WHEN 'CANCELLED' THEN 'OPERATOR_CANCELLED'
                    WHEN 'UNCERTAIN' THEN 'LEASE_LOST_AFTER_WRITE' END,
       t.at, t.at
  FROM generate_series(1, %(n)s) g
 CROSS JOIN LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / %(n)s) AS at) t
 CROSS JOIN LATERAL (SELECT CASE WHEN g %% 1000 = 7 THEN 'UNCERTAIN'
                                 WHEN g %% 100 = 1 THEN 'FAILED'
                                 WHEN g %% 100 = 2 THEN 'CANCELLED'
                                 WHEN g %% 100 >= 92 THEN 'ADMITTED'
                                 ELSE 'DONE' END AS state) s
  JOIN outbox.action_kind k
    ON k.kind = CASE WHEN g %% 1000 = 3 THEN 'BENCH_FILTERED'
                     WHEN g %% 10 = 1 THEN 'BENCH_OTHER'
                     WHEN g %% 10 IN (2, 3) THEN 'BENCH_FENCED'
                     ELSE 'BENCH_NOOP' END
"""

# migration 0019's indexes, and the one it replaced, for the comparison.
WITHOUT_0019 = [
    "DROP INDEX outbox.ix_agent_action_kind_id",
    "DROP INDEX outbox.ix_agent_action_lane_id",
    "DROP INDEX outbox.ix_agent_action_workspace_id",
    "DROP INDEX outbox.ix_agent_action_subject_id",
    "DROP INDEX outbox.ix_agent_action_key_c",
    "CREATE INDEX ix_agent_action_subject ON outbox.agent_action (subject_account_id) "
    "WHERE subject_account_id IS NOT NULL",
    "ANALYZE outbox.agent_action",
]


def filters(now: Any) -> dict[str, ActionFilter]:
    hour_ago, day_ago = now - timedelta(hours=1), now - timedelta(days=1)
    return {
        "none": ActionFilter(),
        "kind (0.1 %)": ActionFilter(kind="BENCH_FILTERED"),
        "kind (70 %)": ActionFilter(kind="BENCH_NOOP"),
        "lane": ActionFilter(lane_key="lane-4242"),
        "key": ActionFilter(key="report:4242:54242"),
        "key prefix (20 keys)": ActionFilter(key_prefix="report:4242:"),
        "key prefix (22 % of keys)": ActionFilter(key_prefix="report:1"),
        "subject": ActionFilter(subject="acct-4242"),
        "workspace": ActionFilter(workspace="ws-42"),
        "state UNCERTAIN": ActionFilter(states=["UNCERTAIN"]),
        "state FAILED, kind (0.1 %)": ActionFilter(states=["FAILED"], kind="BENCH_FILTERED"),
        "state FAILED, lane": ActionFilter(states=["FAILED"], lane_key="lane-4201"),
        "stop reason": ActionFilter(stop_reason="ATTEMPTS_EXHAUSTED"),
        "created in the last hour": ActionFilter(created_since=hour_ago),
        "created before a day ago": ActionFilter(created_until=day_ago),
        "ended in the last hour, kind (70 %)": ActionFilter(
            ended_since=hour_ago, kind="BENCH_NOOP"
        ),
    }


def explained(
    conn: psycopg.Connection[Any], steps: Any, text: list[str]
) -> tuple[Page, list[dict[str, Any]]]:
    """Run a search's steps, each statement once under EXPLAIN (ANALYZE, BUFFERS) and once for
    its rows; the page and the plans (also as text, into ``text``)."""
    plans: list[dict[str, Any]] = []
    answer: Any = None
    try:
        while True:
            step = steps.send(answer)
            assert isinstance(step, Query)
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + step.sql, step.params
            ).fetchone()
            plans.append(plan[0])
            lines = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + step.sql, step.params)
            text.append("\n".join(line for (line,) in lines))
            answer = conn.execute(step.sql, step.params).fetchall()
    except StopIteration as stop:
        return stop.value, plans


def measure_all(
    conn: psycopg.Connection[Any], db: Any, args: argparse.Namespace, build: str
) -> None:
    (now,) = conn.execute("SELECT now()").fetchone()
    for name, action_filter in filters(now).items():
        text: list[str] = []
        page, plans = explained(conn, find_steps(db.outbox, action_filter), text)
        buffers = sum(
            plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"] for plan in plans
        )
        if args.explain:
            log(f"-- {build}: {name}\n" + "\n\n".join(text))
        times = []
        for index in range(args.runs + 1):
            started = time.perf_counter()
            run(conn, find_steps(db.outbox, action_filter))
            if index:
                times.append((time.perf_counter() - started) * 1000)
        emit(
            {
                "filter": name,
                "build": build,
                "rows": args.count,
                "found": len(page.actions),
                "more_may_match": page.more_may_match,
                "statements": len(plans),
                "buffers": buffers,
                "server_ms": round(sum(plan["Execution Time"] for plan in plans), 2),
                "ms": round(statistics.median(times), 2),
            }
        )


def load(conn: psycopg.Connection[Any], count: int) -> None:
    with Timer() as timer:
        conn.execute("SET session_replication_role = replica")
        conn.execute(LOAD, {"n": count})
        conn.execute("SET session_replication_role = DEFAULT")
        conn.execute("VACUUM ANALYZE outbox.agent_action")
    log(f"{count:,} actions in {timer.seconds:.1f} s")


def write_cost(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        builds = {}
        for build in ("0019", "without 0019"):
            db = stack.enter_context(bench_database())
            with psycopg.connect(db.url, autocommit=True) as conn:
                load(conn, args.count)
                if build != "0019":
                    for statement in WITHOUT_0019:
                        conn.execute(statement)
            builds[build] = db
        times: dict[str, list[float]] = {build: [] for build in builds}
        for round_ in range(args.write_cost + 1):
            for build, db in builds.items():
                requests = [
                    ActionRequest("BENCH_NOOP", f"w-{round_}-{n % 500}", f"w:{round_}:{n}")
                    for n in range(args.batch)
                ]
                with psycopg.connect(db.url) as conn:
                    started = time.perf_counter()
                    db.outbox.enqueue_many(conn, requests)
                    conn.commit()
                    if round_:  # the first round warms up
                        times[build].append((time.perf_counter() - started) / args.batch * 1e6)
        for build, runs in times.items():
            emit(
                {
                    "write_cost": build,
                    "rows": args.count,
                    "batch": args.batch,
                    "us_per_action": round(statistics.median(runs), 1),
                    "us_runs": [round(t, 1) for t in runs],
                }
            )


# The bulk forms' filters: what `outbox retry` / `outbox resolve` choose among, with or without
# an indexed field.
MATCHING = {
    "retry: FAILED or CANCELLED": ActionFilter(states=("FAILED", "CANCELLED")),
    "resolve: UNCERTAIN (0.1 %)": ActionFilter(states=("UNCERTAIN",)),
    "retry: FAILED, kind (0.1 %)": ActionFilter(states=("FAILED",), kind="BENCH_FILTERED"),
    "retry: FAILED, lane": ActionFilter(states=("FAILED",), lane_key="lane-4201"),
    "retry: FAILED, stop reason": ActionFilter(
        states=("FAILED",), stop_reason="ATTEMPTS_EXHAUSTED"
    ),
}


def matching(conn: psycopg.Connection[Any], db: Any, args: argparse.Namespace) -> None:
    import asyncio

    from outbox_core import search

    pages = [0]
    find_page = search.afind_actions

    async def counted(*a: Any, **k: Any) -> Any:
        pages[0] += 1
        return await find_page(*a, **k)

    search.afind_actions = counted  # type: ignore[assignment]

    async def once(action_filter: ActionFilter) -> tuple[int, int, float]:
        pages[0] = 0
        async with await psycopg.AsyncConnection.connect(db.url, autocommit=True) as aconn:
            started = time.perf_counter()
            ids = await search.amatching_ids(aconn, db.outbox, action_filter, 1000)
            return len(ids), pages[0], (time.perf_counter() - started) * 1000

    for name, action_filter in MATCHING.items():
        asyncio.run(once(action_filter))  # warm-up
        runs = [asyncio.run(once(action_filter)) for _ in range(args.runs)]
        emit(
            {
                "matching": name,
                "rows": args.count,
                "ids": runs[0][0],
                "pages": runs[0][1],
                "ms": round(statistics.median(run[2] for run in runs), 1),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--no-compare", action="store_true")
    parser.add_argument("--write-cost", type=int, metavar="ROUNDS")
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--matching", action="store_true")
    args = parser.parse_args()
    if args.write_cost:
        write_cost(args)
        return
    with bench_database() as db, psycopg.connect(db.url, autocommit=True) as conn:
        load(conn, args.count)
        conn.execute("SET jit = off")
        if args.matching:
            matching(conn, db, args)
            return
        measure_all(conn, db, args, "0019")
        if not args.no_compare:
            for statement in WITHOUT_0019:
                conn.execute(statement)
            measure_all(conn, db, args, "without 0019")


if __name__ == "__main__":
    main()
