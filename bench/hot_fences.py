"""How many write fences are HOT updates (no new index entry), at the action table's
fillfactor (70, migration 0007) and at PostgreSQL's default (100), on fresh databases.

Each round enqueues ``--actions`` actions, claims them in one statement, fences them in another
(the executor's ``begin_write``) and reads the table's update counts. A fence changes no
indexed column, so it is a HOT update when its row version fits on its page: the claim's new
version took room there, and the fence fits when the page has room left or when pruning frees
the claim's dead version. Pruning frees it only once no snapshot can see it, and a snapshot's
horizon counts the transactions running in every database of the server (the fence's own
snapshot included), so the count depends on what else runs on the server: a measurement, not a
test (the suite checks the premises: test_a_fence_changes_no_indexed_column_and_its_table_keeps_room).

    python bench/hot_fences.py [--actions 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg
from harness import BenchFenced, bench_database, emit, log, median

from outbox_core import ActionRequest


def one_round(actions: int, fillfactor: int) -> tuple[int, int, float]:
    """(updates, HOT updates, load average) for one round on a fresh database."""
    with bench_database() as db:
        db.execute(f"ALTER TABLE {{schema}}.agent_action SET (fillfactor = {int(fillfactor)})")
        kinds = db.outbox.registry.filter([BenchFenced.kind])
        with psycopg.connect(db.url) as conn:
            db.outbox.enqueue_many(
                conn,
                [
                    ActionRequest(BenchFenced.kind, f"hot-{n}", f"hot-{n}", payload={"n": n})
                    for n in range(actions)
                ],
            )
            conn.commit()
            claimed = conn.execute(
                db.outbox.queries["claim"],
                {
                    "limit": actions,
                    "lease": 300.0,
                    "kinds": kinds.kinds,
                    "paths": kinds.paths,
                    "suffixes": kinds.suffixes,
                    "traced": False,
                },
            ).fetchall()
            conn.commit()
        rows = [row for row in claimed if row[0] == "claim"]
        assert len(rows) == actions, f"claimed {len(rows)} of {actions}"
        with psycopg.connect(db.url, autocommit=True) as conn:
            fenced = conn.execute(
                db.outbox.queries["begin_write"],
                {"ids": [r[1] for r in rows], "epochs": [r[11] for r in rows], "margin": 60.0},
                prepare=False,
            ).fetchall()
        assert len(fenced) == actions, f"fenced {len(fenced)} of {actions}"
        load = os.getloadavg()[0]
        # A backend reports its table counts when it exits: both connections are closed.
        for _ in range(400):
            counts = db.rows(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE schemaname = %s AND relname = 'agent_action'",
                (db.schema,),
            )[0]
            if counts[0] >= 2 * actions:
                return int(counts[0]), int(counts[1]), load
            time.sleep(0.05)
        raise RuntimeError("the update counts never arrived in pg_stat_user_tables")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--actions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for fillfactor in (70, 100):
        hot: list[float] = []
        loads: list[float] = []
        for _ in range(args.rounds):
            updates, hot_updates, load = one_round(args.actions, fillfactor)
            # The claims change `state`, which the partial indexes name: never HOT.
            assert updates == 2 * args.actions, "a claim and a fence per action"
            hot.append(hot_updates)
            loads.append(load)
            log(
                f"fillfactor {fillfactor}: {hot_updates} of {args.actions} fences HOT (load {load:.1f})"
            )
        emit(
            {
                "workload": "hot_fences",
                "fillfactor": fillfactor,
                "actions": args.actions,
                "hot_fences": hot,
                "hot_fences_median": median(hot),
                "load_average_1m": loads,
            }
        )


if __name__ == "__main__":
    main()
