"""What a burn-down costs the server per action, build by build: its CPU, B-tree entries,
heap updates (HOT and not), index scans and WAL (issue 34, part 1).

Each run is a fresh database migrated by the build under test: ``--actions`` actions over
``--lanes`` lanes are enqueued (not measured), then one executor in the run's process burns them
down. Measured from the moment the executor starts to the last ending, for that database only,
so that other work on a shared server counts as little as it can:

* ``server_cpu_us``: CPU of the database's backends (/proc, by the pids that pg_stat_activity
  lists for it), per action;
* ``btree_entries``: B-tree leaf inserts (``INSERT_LEAF``, ``INSERT_POST``, ``SPLIT_L``,
  ``SPLIT_R`` records of pg_walinspect) per action, in total and index by index;
* ``<table>_updates`` / ``<table>_non_hot_updates``: pg_stat_user_tables (``n_tup_upd``,
  ``n_tup_hot_upd``) per action, for the tables the executor writes;
* ``index_scans``: pg_stat_user_indexes' ``idx_scan`` per action, in total and index by index
  (each a descent: the probes the statements make);
* ``wal_bytes``: the record lengths of the WAL records that touch the database's blocks, per
  action (``wal_bytes_server``, from ``pg_stat_wal``, is the whole server's).

Builds (``--builds``): ``this`` is the checkout this script is in; any other name is a commit of
this repository (default ``before``: the build before issue 34's layout, 749498e), whose
``outbox-core/src`` is taken with ``git archive`` and put first on ``PYTHONPATH``. Each run of
each build is a process of its own (this script, ``one``), and the builds run interleaved,
``--rounds`` times each (the machine's speed moves: compare within a run).

    python bench/hot_layout.py [--actions 100000] [--lanes 10000] [--rounds 3] [--shape fenced]
        [--builds before,this]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILDS = {"before": "749498e234ff5bf4849b9f14d29123f448bf41a9"}
SHAPES = {"noop": "BENCH_NOOP", "fenced": "BENCH_FENCED"}
LEAF_INSERTS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")
TABLES = ("agent_action", "action_lane", "action_executing")


def backend_cpu(conn: Any) -> dict[int, float]:
    from loopback_http import process_cpu_seconds

    pids = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    cpu = {}
    for (pid,) in pids:
        with contextlib.suppress(OSError):
            cpu[pid] = process_cpu_seconds(pid)
    return cpu


def counters(conn: Any) -> dict[str, int]:
    """The tables' updates and the indexes' scans so far. Backends report their counts when a
    transaction ends (at most once a second) and when they exit: read until two reads agree."""
    last: dict[str, int] = {}
    for _ in range(100):
        conn.execute("SELECT pg_stat_clear_snapshot()")
        now: dict[str, int] = {}
        for name, upd, hot in conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = 'outbox'"
        ):
            if name in TABLES:
                now[f"upd:{name}"], now[f"hot:{name}"] = int(upd), int(hot)
        for name, scans in conn.execute(
            "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE schemaname = 'outbox'"
        ):
            now[f"scan:{name}"] = int(scans)
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    return last


async def burn(url: str, sample: Callable[[], None], kind: str) -> float:
    """Runs one executor until no action is left: the seconds from its start (after it opened
    its connections) to the poll that saw none left. `sample` is called as it polls, and once
    at the end, before the executor closes its connections."""
    import psycopg
    from harness import BENCH_KINDS

    from outbox_core import KindRegistry, Outbox, OutboxSettings
    from outbox_core.executor import Executor

    registry = KindRegistry()
    for adapter in BENCH_KINDS:
        registry.register(adapter, distribution="bench")
    settings = OutboxSettings(
        schema_name="outbox", concurrency=1500, claim_batch=500, pool_size=5, poll_seconds=1.0
    )
    outbox = Outbox(schema="outbox", registry=registry, settings=settings)
    executor = Executor(outbox, url, settings=settings, kinds=[kind])
    await executor.open()
    sample()
    started = time.monotonic()
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            cur = await conn.execute(
                "SELECT count(*) FROM outbox.agent_action WHERE state <> 'DONE'"
            )
            left = (await cur.fetchone())[0]  # type: ignore[index]
            sample()
            if left == 0:
                seconds = time.monotonic() - started
                break
            await asyncio.sleep(0.1)
    stop.set()
    await running
    await executor.close()
    return seconds


def one_run(actions: int, lanes: int, kind: str) -> dict[str, Any]:
    """One burn-down with the outbox_core this process imports."""
    import psycopg
    from harness import bench_database

    from outbox_core import ActionRequest

    with bench_database() as db:
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        with psycopg.connect(db.url) as conn:
            for start in range(0, actions, 10_000):
                db.outbox.enqueue_many(
                    conn,
                    [
                        ActionRequest(kind, f"lane{i % lanes}", f"a-{i}", payload={})
                        for i in range(start, min(start + 10_000, actions))
                    ],
                )
                conn.commit()
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox.agent_action")
            conn.execute("VACUUM ANALYZE outbox.action_lane")
            conn.execute("CHECKPOINT")
            # Keeps the run's WAL until pg_walinspect has read it (the server's checkpoints,
            # which other work on it triggers, would recycle it); dropped with this session.
            conn.execute(
                "SELECT pg_create_physical_replication_slot(%s, true, true)",
                (f"hot_layout_{os.getpid()}",),
            )
            before = counters(conn)
            dboid = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone()[0]  # type: ignore[index]
            start_lsn, wal_before = conn.execute(
                "SELECT pg_current_wal_flush_lsn(), wal_bytes FROM pg_stat_wal"
            ).fetchone()  # type: ignore[misc]
            first: dict[int, float] = {}
            last: dict[int, float] = {}

            def sample() -> None:
                # The executor's backends, from when each is first seen to the end.
                for pid, cpu_seconds in backend_cpu(conn).items():
                    first.setdefault(pid, cpu_seconds)
                    last[pid] = cpu_seconds

            seconds = asyncio.run(burn(db.url, sample, kind))
            cpu_used = sum(last[pid] - first[pid] for pid in last)
            end_lsn, wal_after = conn.execute(
                "SELECT pg_current_wal_flush_lsn(), wal_bytes FROM pg_stat_wal"
            ).fetchone()  # type: ignore[misc]
            records = conn.execute(
                """
                SELECT resource_manager, record_type,
                       coalesce(pg_filenode_relation(0, (regexp_match(block_ref,
                           'rel \\d+/\\d+/(\\d+)'))[1]::oid)::text, '?') AS rel,
                       count(*), sum(record_length)
                  FROM pg_get_wal_records_info(%s, %s)
                 WHERE block_ref LIKE %s
                 GROUP BY 1, 2, 3
                """,
                (start_lsn, end_lsn, f"%/{dboid}/%"),
            ).fetchall()
            after = counters(conn)
    entries: dict[str, int] = {}
    wal_bytes = 0
    for rmgr, record_type, rel, count, length in records:
        wal_bytes += int(length)
        if rmgr == "Btree" and record_type in LEAF_INSERTS:
            name = rel.removeprefix("outbox.")
            entries[name] = entries.get(name, 0) + int(count)
    per = 1 / actions
    scans = {
        key.removeprefix("scan:"): (after[key] - before.get(key, 0)) * per
        for key in after
        if key.startswith("scan:") and after[key] != before.get(key, 0)
    }
    result: dict[str, Any] = {
        "actions": actions,
        "lanes": lanes,
        "kind": kind,
        "rate_per_s": round(actions / seconds),
        "server_cpu_us": round(cpu_used * per * 1e6, 1),
        "btree_entries": round(sum(entries.values()) * per, 2),
        "btree_entries_by_index": {k: round(v * per, 2) for k, v in sorted(entries.items())},
        "index_scans": round(sum(scans.values()), 2),
        "index_scans_by_index": {k: round(v, 2) for k, v in sorted(scans.items())},
        "wal_bytes": round(wal_bytes * per),
        "wal_bytes_server": round((int(wal_after) - int(wal_before)) * per),
    }
    for table in TABLES:
        if f"upd:{table}" not in after:
            continue
        updates = after[f"upd:{table}"] - before.get(f"upd:{table}", 0)
        hot = after[f"hot:{table}"] - before.get(f"hot:{table}", 0)
        result[f"{table}_updates"] = round(updates * per, 2)
        result[f"{table}_non_hot_updates"] = round((updates - hot) * per, 2)
    return result


def build_source(name: str, into: Path) -> Path:
    """The outbox-core/src of a build: this checkout's, or a commit's from git."""
    if name == "this":
        return ROOT / "outbox-core" / "src"
    commit = BUILDS.get(name, name)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "outbox-core/src"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into / name, filter="data")
    return into / name / "outbox-core" / "src"


def run_build(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    command = [sys.executable, __file__, "one", "--actions", str(args.actions)]
    command += ["--lanes", str(args.lanes), "--shape", args.shape]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"a run of {src} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=["compare", "one"], default="compare")
    parser.add_argument("--actions", type=int, default=100_000)
    parser.add_argument("--lanes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--builds", default="before,this")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="noop",
        help="noop: each attempt returns Done; fenced: each begins its write first",
    )
    parser.add_argument("--out", type=Path, help="also append each result here (JSON lines)")
    args = parser.parse_args()
    if args.mode == "one":
        import outbox_core

        result = one_run(args.actions, args.lanes, SHAPES[args.shape])
        result["core"] = str(Path(outbox_core.__file__).parent)
        print(json.dumps(result))
        return
    from harness import emit, log

    builds = args.builds.split(",")
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in builds}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {b: build_source(b, Path(tmp)) for b in builds}
        for round_ in range(args.rounds):
            for build in builds:
                result = {"bench": "hot_layout", "build": build, **run_build(sources[build], args)}
                results[build].append(result)
                log(f"round {round_ + 1} {build}: {result}")
                emit(result)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(result) + "\n")
    for build, runs in results.items():
        emit(
            {
                "bench": "hot_layout_median",
                "build": build,
                "shape": args.shape,
                **{
                    key: statistics.median(r.get(key, 0) for r in runs)
                    for key in runs[0]
                    if isinstance(runs[0][key], (int, float)) and key not in ("actions", "lanes")
                },
                "btree_entries_by_index": _medians(runs, "btree_entries_by_index"),
                "index_scans_by_index": _medians(runs, "index_scans_by_index"),
            }
        )


def _medians(runs: list[dict[str, Any]], field: str) -> dict[str, float]:
    names = sorted({name for run in runs for name in run[field]})
    return {name: statistics.median(run[field].get(name, 0) for run in runs) for name in names}


if __name__ == "__main__":
    main()
