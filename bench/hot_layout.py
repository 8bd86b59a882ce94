"""What a no-op burn-down writes per action, layout by layout: the server's CPU, B-tree
entries, heap updates (HOT and not) and WAL (issue 34, part 1).

Each run is a fresh database: ``--actions`` no-op actions over ``--lanes`` lanes are enqueued
(not measured), then one executor in this process burns them down. Measured from the moment
the executor starts to the last ending, for this database only, so that the other work on a
shared server counts as little as it can:

* ``server_cpu_us``: CPU of this database's backends (/proc, by the pids that
  pg_stat_activity lists for it), per action;
* ``btree_entries``: B-tree leaf inserts (``INSERT_LEAF``, ``INSERT_POST``, ``SPLIT_L``,
  ``SPLIT_R`` records of pg_walinspect) per action, in total and index by index;
* ``heap_updates`` / ``hot_updates``: pg_stat_user_tables (``n_tup_upd``, ``n_tup_hot_upd``)
  of agent_action and action_lane, per action;
* ``wal_bytes``: the record lengths of the WAL records that touch this database's blocks, per
  action (``pg_stat_wal``'s figure is the whole server's; it is printed beside it).

Layouts (``--variants``; every one but ``shipped`` is a prototype applied to the bench database
only, never a migration):

* ``shipped``: the migrations as they are;
* ``hot_unguarded``: no index names ``state`` or ``ended_at`` (the live-lane index becomes
  ``(lane_key, id)`` for every row, the expiry index keeps ``expires_at IS NOT NULL`` only; the
  executing-lane, ended and uncertain indexes are dropped), fillfactor 50. It keeps no database
  rule for one executing action per lane: the figure of what HOT buys, not a layout to ship;
* ``shipped_c``: the shipped layout with the keys (``lane_key``, ``idempotency_key``) in
  ``COLLATE "C"``;
* ``hot_side_table``: ``hot_unguarded`` with one executing action per lane back in the database
  as a unique key of a side table (``action_executing``, one row per lane with an executing
  action) that triggers on agent_action keep (an insert when an action becomes EXECUTING, a
  delete when it stops, or is deleted), and the claim reading a lane's holder there;
* ``hot_lane_row``: ``hot_unguarded`` with one executing action per lane kept by the lane row
  instead: ``action_lane.exec_id`` (not indexed), written by a trigger under the lane row's
  lock when an action becomes EXECUTING (refused, as the unique index refused it, when the
  lane already has another holder), cleared when it stops or is deleted; the claim reads the
  holder from the lane row it has locked;
* ``hot_lane_row_lazy``: the same column written at claims only (it names the lane's last
  claimed action, which holds the lane while it is EXECUTING): endings write no lane row.

Variants run interleaved, ``--rounds`` times each (the machine's speed moves: compare within a
run).

    python bench/hot_layout.py [--actions 20000] [--lanes 2000] [--rounds 3] [--shape fenced]

``--shape fenced``: each attempt begins its write (the fence's mark, a third update of the
action) before it returns Done. The layouts without the state indexes run begin_write with
one primary-key probe per id (``BEGIN_WRITE_BY_ID``): as shipped, it scans the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from harness import BENCH_KINDS, bench_database, emit, log
from loopback_http import process_cpu_seconds

from outbox_core import ActionRequest, KindRegistry, Outbox, OutboxSettings
from outbox_core.executor import Executor

UNGUARDED = [
    "DROP INDEX outbox.ux_agent_action_lane_executing",
    # The head search walks ix_agent_action_lane_id, (lane_key, id) for every row, which
    # migration 0019 built for the search (before it, this prototype built its own).
    "DROP INDEX outbox.ix_agent_action_lane_head",
    "DROP INDEX outbox.ix_agent_action_ended",
    "DROP INDEX outbox.ix_agent_action_expiry",
    "CREATE INDEX ix_agent_action_expiry ON outbox.agent_action (expires_at) "
    "WHERE expires_at IS NOT NULL",
    "DROP INDEX outbox.ix_agent_action_uncertain",
    "ALTER TABLE outbox.agent_action SET (fillfactor = 50)",
]

SIDE_TABLE = [
    "CREATE TABLE outbox.action_executing (lane_key text PRIMARY KEY, action_id bigint NOT NULL)",
    """CREATE FUNCTION outbox.hold_lane() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.state = 'EXECUTING' THEN
            INSERT INTO outbox.action_executing (lane_key, action_id) VALUES (NEW.lane_key, NEW.id);
        ELSE
            DELETE FROM outbox.action_executing WHERE lane_key = OLD.lane_key AND action_id = OLD.id;
        END IF;
        RETURN NULL;
    END $fn$""",
    "CREATE TRIGGER hold_lane AFTER UPDATE OF state ON outbox.agent_action FOR EACH ROW "
    "WHEN ((NEW.state = 'EXECUTING') <> (OLD.state = 'EXECUTING')) "
    "EXECUTE FUNCTION outbox.hold_lane()",
    "CREATE TRIGGER free_lane AFTER DELETE ON outbox.agent_action FOR EACH ROW "
    "WHEN (OLD.state = 'EXECUTING') EXECUTE FUNCTION outbox.hold_lane()",
]

# One executing action per lane kept by the lane row: action_lane.exec_id (not indexed) names
# the lane's holder. A trigger writes it when an action becomes EXECUTING, under the lane row's
# lock, and only where it is free or already this action's: a second claim of the lane waits
# for the first's lock and then finds the lane taken (READ COMMITTED), or fails to serialize
# (REPEATABLE READ, SERIALIZABLE: the row changed after its snapshot). A lane without a row (an
# older build's proposal, a row inserted by hand) gets one. The error is the one the unique
# index gave. The ending, and the delete of an executing action, clear it.
LANE_ROW_TAKEN = """RAISE EXCEPTION
                'duplicate key value violates unique constraint "ux_agent_action_lane_executing"'
                USING ERRCODE = 'unique_violation',
                      CONSTRAINT = 'ux_agent_action_lane_executing',
                      TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
                      DETAIL = format('Key (lane_key)=(%s) already exists.', NEW.lane_key);"""
# A lane without its row (an older build's proposal, a row inserted by hand) gets one naming
# the holder; a row another claim made meanwhile means the lane is taken.
INSERT_LANE_ROW = f"""INSERT INTO outbox.action_lane (lane_key, exec_id) VALUES (NEW.lane_key, NEW.id)
                    ON CONFLICT (lane_key) DO NOTHING;
                IF NOT FOUND THEN
                    {LANE_ROW_TAKEN}
                END IF;"""
LANE_ROW = [
    # Room on the lane rows' pages for the versions that change exec_id alone (no index names
    # it) to be HOT.
    "ALTER TABLE outbox.action_lane ADD COLUMN exec_id bigint, SET (fillfactor = 50)",
    f"""CREATE FUNCTION outbox.lane_exec() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.state = 'EXECUTING' THEN
            UPDATE outbox.action_lane SET exec_id = NEW.id
             WHERE lane_key = NEW.lane_key AND (exec_id IS NULL OR exec_id = NEW.id);
            IF NOT FOUND THEN
                {INSERT_LANE_ROW}
            END IF;
        ELSE
            UPDATE outbox.action_lane SET exec_id = NULL
             WHERE lane_key = OLD.lane_key AND exec_id = OLD.id;
        END IF;
        RETURN NULL;
    END $fn$""",
    "CREATE TRIGGER lane_exec AFTER UPDATE OF state ON outbox.agent_action FOR EACH ROW "
    "WHEN ((NEW.state = 'EXECUTING') <> (OLD.state = 'EXECUTING')) "
    "EXECUTE FUNCTION outbox.lane_exec()",
    "CREATE TRIGGER lane_exec_delete AFTER DELETE ON outbox.agent_action FOR EACH ROW "
    "WHEN (OLD.state = 'EXECUTING') EXECUTE FUNCTION outbox.lane_exec()",
    # exec_id is the trigger's alone: a hand-written update of it, or a delete of a lane row
    # that names a holder, would free the lane (the claim's delete of an empty lane never
    # meets one: its holder would make it not empty).
    """CREATE FUNCTION outbox.lane_exec_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        RAISE EXCEPTION 'action_lane %: exec_id is kept by agent_action''s trigger',
            OLD.lane_key USING ERRCODE = 'check_violation';
    END $fn$""",
    "CREATE TRIGGER lane_exec_guard BEFORE UPDATE OF exec_id ON outbox.action_lane "
    "FOR EACH ROW WHEN (pg_trigger_depth() = 0) EXECUTE FUNCTION outbox.lane_exec_guard()",
    "CREATE TRIGGER lane_exec_guard_delete BEFORE DELETE ON outbox.action_lane "
    "FOR EACH ROW WHEN (OLD.exec_id IS NOT NULL) EXECUTE FUNCTION outbox.lane_exec_guard()",
]

# The same rule with the lane row written at claims only: exec_id names the last action that
# became EXECUTING in the lane, and the lane is taken while that action still is. A claim
# locks the lane row (the claim function holds it already), then reads the named action's
# state in a statement of its own (READ COMMITTED: after every claim that held the lock has
# committed; REPEATABLE READ: the lane row's write fails to serialize instead). Endings and
# deletes write nothing more: a producer's enqueue that holds the lane row never makes an
# ending wait.
LANE_ROW_LAZY = [
    LANE_ROW[0],
    f"""CREATE FUNCTION outbox.lane_exec() RETURNS trigger LANGUAGE plpgsql AS $fn$
    DECLARE
        v_holder bigint;
    BEGIN
        SELECT exec_id INTO v_holder FROM outbox.action_lane
         WHERE lane_key = NEW.lane_key FOR UPDATE;
        IF NOT FOUND THEN
            {INSERT_LANE_ROW}
            RETURN NULL;
        END IF;
        IF v_holder IS DISTINCT FROM NEW.id THEN
            IF EXISTS (SELECT 1 FROM outbox.agent_action
                        WHERE id = v_holder AND state = 'EXECUTING') THEN
                {LANE_ROW_TAKEN}
            END IF;
            UPDATE outbox.action_lane SET exec_id = NEW.id WHERE lane_key = NEW.lane_key;
        END IF;
        RETURN NULL;
    END $fn$""",
    "CREATE TRIGGER lane_exec AFTER UPDATE OF state ON outbox.agent_action FOR EACH ROW "
    "WHEN (NEW.state = 'EXECUTING' AND OLD.state <> 'EXECUTING') "
    "EXECUTE FUNCTION outbox.lane_exec()",
    """CREATE FUNCTION outbox.lane_exec_guard() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        IF TG_OP = 'DELETE' AND NOT EXISTS (
            SELECT 1 FROM outbox.agent_action WHERE id = OLD.exec_id AND state = 'EXECUTING'
        ) THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'action_lane %: exec_id is kept by agent_action''s trigger',
            OLD.lane_key USING ERRCODE = 'check_violation';
    END $fn$""",
    LANE_ROW[5],
    LANE_ROW[6],
]

# The claim's search for a lane's executing holder, as migration 0012 wrote it, and what the
# prototypes read instead (the holder is live, so at or after head_id).
HOLDER = (
    'SELECT e.id FROM "outbox".agent_action e\n'
    "                 WHERE e.lane_key = l.lane_key AND e.state = 'EXECUTING'"
)
HOLDER_BOUNDED = HOLDER + " AND e.id >= l.head_id"
# The side table's holder, taken only while the action is still EXECUTING.
HOLDER_SIDE = (
    "SELECT e.action_id AS id FROM outbox.action_executing e "
    "JOIN outbox.agent_action x ON x.id = e.action_id AND x.state = 'EXECUTING' "
    "WHERE e.lane_key = l.lane_key"
)
# The lane row's holder: read with the lane row the claim has locked.
LANES = (
    'SELECT l.lane_key, coalesce(l.head_id, 0) AS head_id\n          FROM "outbox".action_lane l'
)
LANES_EXEC = (
    "SELECT l.lane_key, coalesce(l.head_id, 0) AS head_id, l.exec_id\n"
    '          FROM "outbox".action_lane l'
)
HOLDER_LANE_ROW = "SELECT l.exec_id AS id WHERE l.exec_id IS NOT NULL"
HOLDER_LANE_ROW_LAZY = (
    "SELECT e.id FROM outbox.agent_action e WHERE e.id = l.exec_id AND e.state = 'EXECUTING'"
)

# The keys in byte order. A column that a trigger's WHEN clause names cannot change its type
# or collation, so those triggers are dropped and created again as they were.
KEYS_C = [
    'ALTER TABLE outbox.agent_action ALTER COLUMN lane_key TYPE text COLLATE "C", '
    'ALTER COLUMN idempotency_key TYPE text COLLATE "C"',
    'ALTER TABLE outbox.action_lane ALTER COLUMN lane_key TYPE text COLLATE "C"',
]

VARIANTS: dict[str, tuple[list[str], str | None, bool]] = {
    "shipped": ([], None, False),
    "shipped_c": ([], None, True),
    "hot_unguarded": (UNGUARDED, HOLDER_BOUNDED, False),
    "hot_side_table": (UNGUARDED + SIDE_TABLE, HOLDER_SIDE, False),
    "hot_side_table_c": (UNGUARDED + SIDE_TABLE, HOLDER_SIDE, True),
    "hot_lane_row": (UNGUARDED + LANE_ROW, HOLDER_LANE_ROW, False),
    "hot_lane_row_lazy": (UNGUARDED + LANE_ROW_LAZY, HOLDER_LANE_ROW_LAZY, False),
}

# begin_write finds its rows by id and checks the state, and its planner reads the state's
# selectivity (EXECUTING: rare) as the join's: with an index on state it walked
# ux_agent_action_lane_executing, without one it scans the table once per fence batch and
# compares every executing row with every id (measured: 3x the server's CPU of a fenced
# burn, 12 of the bench's 15 s in begin_write). The layouts without that index probe the
# primary key instead: one probe per id (a lateral subquery).
BEGIN_WRITE_BY_ID = [
    (
        "      FROM free\n     WHERE a.id = free.id AND free.roomy",
        "     WHERE a.id = ANY(ARRAY(SELECT free.id FROM free WHERE free.roomy))",
    ),
    (
        "      FROM {schema}.agent_action a JOIN f ON a.id = f.id AND a.epoch = f.epoch\n"
        "     WHERE a.state = 'EXECUTING'\n"
        "       FOR NO KEY UPDATE OF a SKIP LOCKED",
        "      FROM f CROSS JOIN LATERAL (\n"
        "           SELECT a.id, a.lease_until FROM {schema}.agent_action a\n"
        "            WHERE a.id = f.id AND a.epoch = f.epoch AND a.state = 'EXECUTING'\n"
        "              FOR NO KEY UPDATE SKIP LOCKED) a",
    ),
    (
        "  JOIN {schema}.agent_action a ON a.id = busy.id AND a.epoch = busy.epoch\n"
        " WHERE a.state = 'EXECUTING'",
        "  CROSS JOIN LATERAL (\n"
        "       SELECT a.id, a.lease_until FROM {schema}.agent_action a\n"
        "        WHERE a.id = busy.id AND a.epoch = busy.epoch AND a.state = 'EXECUTING'\n"
        "       OFFSET 0) a",  # not flattened into a join the planner orders again
    ),
]


def prototype_queries(queries: dict[str, str], variant: str) -> None:
    """The statements the executor runs, as a layout without the state indexes needs them."""
    if UNGUARDED[0] not in VARIANTS[variant][0]:
        return
    text = queries["begin_write"]
    for old, new in BEGIN_WRITE_BY_ID:
        old, new = (x.replace("{schema}", '"outbox"') for x in (old, new))
        if old not in text:
            raise RuntimeError("begin_write no longer reads as this bench expects")
        text = text.replace(old, new)
    queries["begin_write"] = text


# The burn-down's shapes: the kind its actions are.
SHAPES = {"noop": "BENCH_NOOP", "fenced": "BENCH_FENCED"}

LEAF_INSERTS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")


def apply_variant(conn: psycopg.Connection[Any], name: str) -> None:
    statements, holder, keys_c = VARIANTS[name]
    for statement in statements:
        conn.execute(statement)
    if keys_c:
        triggers = conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = 'outbox.agent_action'::regclass AND NOT tgisinternal "
            "AND pg_get_triggerdef(oid) ~ '(lane_key|idempotency_key)'"
        ).fetchall()
        for trigger, _ in triggers:
            conn.execute(f"DROP TRIGGER {trigger} ON outbox.agent_action")
        for statement in KEYS_C:
            conn.execute(statement)
        if SIDE_TABLE[0] in statements:
            # Every lane_key column in one collation, or the side table's key no longer
            # serves the claim's probe (measured: 3-5x the server's CPU).
            conn.execute(
                'ALTER TABLE outbox.action_executing ALTER COLUMN lane_key TYPE text COLLATE "C"'
            )
        for _, definition in triggers:
            conn.execute(definition)
    if holder is not None:
        replace_holder(conn, "outbox", holder, lane_row=LANE_ROW[0] in statements)


def replace_holder(
    conn: psycopg.Connection[Any], schema: str, holder: str, *, lane_row: bool
) -> None:
    """claim_locked_v1 of `schema` restated with `holder` as its search for a lane's executing
    action (and, for the lane row's holder, the lane row's exec_id read with the lane)."""
    quoted = f'"{schema}".'
    row = conn.execute(
        "SELECT pg_get_functiondef(%s::regproc)", (f"{quoted}claim_locked_v1",)
    ).fetchone()
    assert row is not None
    text = str(row[0])
    old_holder, old_lanes = (x.replace('"outbox".', quoted) for x in (HOLDER, LANES))
    if old_holder not in text or old_lanes not in text:
        raise RuntimeError("claim_locked_v1 no longer reads the holder as this bench expects")
    if lane_row:
        text = text.replace(old_lanes, LANES_EXEC.replace('"outbox".', quoted))
    holder = holder.replace('"outbox".', quoted).replace("outbox.", quoted)
    conn.execute(text.replace(old_holder, holder))


def backend_cpu(conn: psycopg.Connection[Any]) -> dict[int, float]:
    pids = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    cpu = {}
    for (pid,) in pids:
        with contextlib.suppress(OSError):
            cpu[pid] = process_cpu_seconds(pid)
    return cpu


def table_updates(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    """Waits until the backends that exited have reported their counts (they do at exit)."""
    last: dict[str, tuple[int, int]] = {}
    for _ in range(100):
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = 'outbox' AND relname IN ('agent_action', 'action_lane')"
        ).fetchall()
        now = {name: (int(upd), int(hot)) for name, upd, hot in rows}
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    return last


async def burn(url: str, sample: Callable[[], None], kind: str, variant: str) -> float:
    """Runs one executor until no action is left: the seconds from its start (after it opened
    its connections) to the poll that saw none left. `sample` is called as it polls, and once
    at the end, before the executor closes its connections."""
    registry = KindRegistry()
    for adapter in BENCH_KINDS:
        registry.register(adapter, distribution="bench")
    settings = OutboxSettings(
        schema_name="outbox", concurrency=1500, claim_batch=500, pool_size=5, poll_seconds=1.0
    )
    outbox = Outbox(schema="outbox", registry=registry, settings=settings)
    # A copy: the package's statements are one dict for every Outbox of the process.
    queries = dict(outbox.queries)
    prototype_queries(queries, variant)
    vars(outbox)["queries"] = queries
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


def one_run(variant: str, actions: int, lanes: int, kind: str = "BENCH_NOOP") -> dict[str, Any]:
    with bench_database() as db:
        with psycopg.connect(db.url, autocommit=True) as conn:
            apply_variant(conn, variant)
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
            before = table_updates(conn)
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

            seconds = asyncio.run(burn(db.url, sample, kind, variant))
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
            after = table_updates(conn)
    entries: dict[str, int] = {}
    wal_bytes = 0
    for rmgr, record_type, rel, count, length in records:
        wal_bytes += int(length)
        if rmgr == "Btree" and record_type in LEAF_INSERTS:
            name = rel.removeprefix("outbox.")
            entries[name] = entries.get(name, 0) + int(count)
    per = 1 / actions
    result: dict[str, Any] = {
        "bench": "hot_layout",
        "variant": variant,
        "actions": actions,
        "lanes": lanes,
        "kind": kind,
        "rate_per_s": round(actions / seconds),
        "server_cpu_us": round(cpu_used * per * 1e6, 1),
        "btree_entries": round(sum(entries.values()) * per, 2),
        "btree_entries_by_index": {k: round(v * per, 2) for k, v in sorted(entries.items())},
        "wal_bytes": round(wal_bytes * per),
        "wal_bytes_server": round((int(wal_after) - int(wal_before)) * per),
    }
    for table in ("agent_action", "action_lane"):
        updates = after[table][0] - before[table][0]
        hot = after[table][1] - before[table][1]
        result[f"{table}_updates"] = round(updates * per, 2)
        result[f"{table}_non_hot_updates"] = round((updates - hot) * per, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--actions", type=int, default=20_000)
    parser.add_argument("--lanes", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="noop",
        help="noop: each attempt returns Done; fenced: each begins its write first",
    )
    parser.add_argument("--out", type=Path, help="also append each result here (JSON lines)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            result = one_run(variant, args.actions, args.lanes, SHAPES[args.shape])
            results[variant].append(result)
            log(f"round {round_ + 1} {variant}: {result}")
            emit(result)
            if args.out:
                with args.out.open("a") as out:
                    out.write(f"{result}\n")
    for variant, runs in results.items():
        emit(
            {
                "bench": "hot_layout_median",
                "variant": variant,
                **{
                    key: statistics.median(r[key] for r in runs)
                    for key in runs[0]
                    if isinstance(runs[0][key], (int, float)) and key not in ("actions", "lanes")
                },
            }
        )


if __name__ == "__main__":
    main()
