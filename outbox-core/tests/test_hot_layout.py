"""The layout that makes a claim and an ending HOT updates (migrations 20 and 21, issue 34), rule
by rule: no index of agent_action names a column that a claim, a fence or an ending changes;
action_executing holds exactly the executing actions, one a lane, whoever writes the actions,
and nothing else writes it; action_failure holds exactly the failed and uncertain actions.
Each test fails when its rule is dropped (test_lane_rule.py holds the lane rule itself against
every client)."""

from __future__ import annotations

import random
import re
import time
from typing import Any

import psycopg
import pytest

from outbox_core import ActionRequest, live_reads
from outbox_core.operator import resolve_absent
from outbox_core.testing import OutboxTestDatabase

from .operator_support import ended_by_executor, fence_then_uncertain

# What a claim, a fence, a reread, a retry, a deferral and an ending write (claim_locked_v1,
# begin_write, settle_v2): an index naming any of them makes those updates write an entry into
# every index of the table.
CHANGED_BY_EXECUTOR = (
    "state",
    "epoch",
    "attempt",
    "lease_until",
    "due_at",
    "write_started_at",
    "ended_at",
    "stop_reason",
    "readback_ref",
    "last_result",
    "last_detail",
    "payload",
)


def enqueue(db: OutboxTestDatabase, lane: str, key: str, kind: str = "TEST_NOOP") -> int:
    with db.connect() as conn:
        action_id = db.outbox.enqueue(conn, ActionRequest(kind, lane, key)).id
        conn.commit()
    return action_id


def sql(db: OutboxTestDatabase, query: str) -> str:
    return query.replace("{schema}", f'"{db.schema}"')


def holders(db: OutboxTestDatabase) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """action_executing's rows, and the executing actions, by lane."""
    return (
        db.rows("SELECT lane_key, action_id FROM {schema}.action_executing ORDER BY 1"),
        db.rows(
            "SELECT lane_key, id FROM {schema}.agent_action WHERE state = 'EXECUTING' ORDER BY 1"
        ),
    )


def test_no_index_of_agent_action_names_a_column_that_the_executor_changes(
    db: OutboxTestDatabase,
) -> None:
    definitions = db.rows(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index "
        "WHERE indrelid = %s::regclass",
        (f'"{db.schema}".agent_action',),
    )
    assert definitions
    named = {
        index: sorted(c for c in CHANGED_BY_EXECUTOR if re.search(rf"\b{c}\b", definition))
        for index, definition in definitions
    }
    assert {index: columns for index, columns in named.items() if columns} == {}


def test_a_claim_a_fence_and_an_ending_are_hot_updates(db: OutboxTestDatabase) -> None:
    """On a page with room, the executor's claim, fence and ending of an action write no index
    entry (n_tup_hot_upd counts every update). One index on `state` makes them all cold."""
    ids = [enqueue(db, f"lane-{n}", f"k-{n}", kind="TEST_FENCED") for n in range(4)]
    db.drain()
    assert db.rows(
        "SELECT count(*) FROM {schema}.agent_action WHERE state = 'DONE' AND id = ANY(%s)", (ids,)
    ) == [(4,)]
    # Each executor backend reports its counts when it exits; the drain closed them.
    counts: list[tuple[int, int]] = []
    for _ in range(100):
        counts = db.rows(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'agent_action'",
            (db.schema,),
        )
        if counts and counts[0][0] >= 12:
            break
        time.sleep(0.05)
        db.execute("SELECT pg_stat_clear_snapshot()")
    updates, hot = counts[0]
    assert updates == 12  # a claim, a fence and an ending each
    assert hot == updates


def test_the_action_table_leaves_half_of_each_page_free_for_those_versions(
    db: OutboxTestDatabase,
) -> None:
    """A claim's and an ending's versions are HOT only if they fit on the row's page: at
    fillfactor 50 (measured in docs/benchmarks.md, "HOT claims and endings")."""
    options = db.scalar(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f'"{db.schema}".agent_action',)
    )
    assert "fillfactor=50" in options


CLAIM_BY_HAND = (
    "UPDATE {schema}.agent_action SET state = 'EXECUTING', epoch = epoch + 1, "
    "attempt = attempt + 1, lease_until = now() + make_interval(secs => %s) "
    "WHERE id = %s AND state = 'ADMITTED'"
)
RECLAIM_BY_HAND = (
    "UPDATE {schema}.agent_action SET epoch = epoch + 1, attempt = attempt + 1, "
    "lease_until = now() + interval '5 minutes' "
    "WHERE id = %s AND state = 'EXECUTING' AND lease_until <= now()"
)
END_BY_HAND = (
    "UPDATE {schema}.agent_action SET state = %s, stop_reason = 'TEST', payload = NULL "
    "WHERE id = %s AND state = 'EXECUTING'"
)
RETRY_BY_HAND = (
    "UPDATE {schema}.agent_action SET state = 'ADMITTED', lease_until = NULL "
    "WHERE id = %s AND state = 'EXECUTING'"
)


@pytest.mark.parametrize("seed", range(4))
def test_action_executing_holds_exactly_the_executing_actions_whoever_writes_them(
    db: OutboxTestDatabase, seed: int
) -> None:
    """Claims by the claim function and by hand (refused where the lane is held), reclaims of
    run-out leases, endings in every state, retries, an ending and the next claim of a lane in
    one statement, and deletes of executing actions, in a random order: after each,
    action_executing is the executing actions, lane for lane."""
    rng = random.Random(seed)
    refusals: list[str | None] = []
    lanes = [f"lane-{n}" for n in range(5)]
    serial = 0
    kinds = db.outbox.registry.filter(["TEST_NOOP"])
    claim = db.outbox.queries["claim"]
    with db.connect(autocommit=True) as conn:
        for _ in range(120):
            live = db.rows(
                "SELECT id, lane_key, state, lease_until <= now() FROM {schema}.agent_action "
                "WHERE state IN ('ADMITTED', 'EXECUTING') ORDER BY id"
            )
            admitted = [row for row in live if row[2] == "ADMITTED"]
            executing = [row for row in live if row[2] == "EXECUTING"]
            step = rng.choice(
                ["enqueue", "claim", "by hand", "end", "retry", "reclaim", "swap", "delete"]
            )
            try:
                if step == "enqueue" or not live:
                    serial += 1
                    enqueue(db, rng.choice(lanes), f"k-{serial}")
                elif step == "claim":
                    lease = rng.choice([0.001, 300.0])
                    conn.execute(
                        claim,
                        {
                            "limit": 3,
                            "lease": lease,
                            "kinds": kinds.kinds,
                            "paths": kinds.paths,
                            "suffixes": kinds.suffixes,
                            "traced": False,
                        },
                    ).fetchall()
                elif step == "by hand" and admitted:
                    target = rng.choice(admitted)[0]
                    conn.execute(sql(db, CLAIM_BY_HAND), (rng.choice([0.001, 300.0]), target))
                elif step == "end" and executing:
                    state = rng.choice(["DONE", "FAILED", "UNCERTAIN", "CANCELLED"])
                    conn.execute(sql(db, END_BY_HAND), (state, rng.choice(executing)[0]))
                elif step == "retry" and executing:
                    conn.execute(sql(db, RETRY_BY_HAND), (rng.choice(executing)[0],))
                elif step == "reclaim" and executing:
                    conn.execute(sql(db, RECLAIM_BY_HAND), (rng.choice(executing)[0],))
                elif step == "swap" and executing:
                    # The lane's holder ends and its next admitted action is claimed, by one
                    # statement.
                    holder, lane = rng.choice(executing)[:2]
                    behind = [row[0] for row in admitted if row[1] == lane]
                    if behind:
                        conn.execute(
                            sql(
                                db,
                                "UPDATE {schema}.agent_action SET "
                                "state = CASE WHEN id = %(h)s THEN 'DONE' ELSE 'EXECUTING' END, "
                                "stop_reason = CASE WHEN id = %(h)s THEN 'TEST' END, "
                                "payload = CASE WHEN id = %(h)s THEN NULL ELSE payload END, "
                                "epoch = CASE WHEN id = %(h)s THEN epoch ELSE epoch + 1 END, "
                                "attempt = CASE WHEN id = %(h)s THEN attempt ELSE attempt + 1 END, "
                                "lease_until = CASE WHEN id = %(h)s THEN lease_until "
                                "ELSE now() + interval '5 minutes' END "
                                "WHERE id IN (%(h)s, %(b)s)",
                            ),
                            {"h": holder, "b": behind[0]},
                        )
                elif step == "delete" and executing:
                    conn.execute(
                        sql(db, "DELETE FROM {schema}.agent_action WHERE id = %s"),
                        (rng.choice(executing)[0],),
                    )
            except psycopg.errors.UniqueViolation as exc:
                # A second action of a held lane: refused, and by the lane rule's index.
                refusals.append(exc.diag.constraint_name)
            side, actual = holders(db)
            assert side == actual, step
            assert len({lane for lane, _ in actual}) == len(actual)
    # Claims by hand of held lanes were tried, and each was refused by the lane rule's index.
    assert refusals and set(refusals) == {"ux_agent_action_lane_executing"}


@pytest.mark.parametrize(
    "write",
    [
        "DELETE FROM {schema}.action_executing",
        "UPDATE {schema}.action_executing SET action_id = action_id + 1000",
        "UPDATE {schema}.action_executing SET lane_key = 'elsewhere'",
        "INSERT INTO {schema}.action_executing (lane_key, action_id) VALUES ('lane-b', 1)",
        "TRUNCATE {schema}.action_executing",
    ],
)
def test_no_write_to_action_executing_but_its_triggers_is_taken(
    db: OutboxTestDatabase, write: str
) -> None:
    """A deleted or changed row would let a second action of the lane execute; an invented
    one would hold a lane for nobody."""
    head = enqueue(db, "lane-a", "a-1")
    enqueue(db, "lane-a", "a-2")
    db.execute(CLAIM_BY_HAND, (300.0, head))
    with pytest.raises(psycopg.errors.RestrictViolation, match="written only by"):
        db.execute(write)
    assert holders(db) == ([("lane-a", head)], [("lane-a", head)])


def test_a_truncate_of_the_actions_empties_the_lanes_they_held(db: OutboxTestDatabase) -> None:
    head = enqueue(db, "lane-a", "a-1")
    db.execute(CLAIM_BY_HAND, (300.0, head))
    db.execute("TRUNCATE {schema}.agent_action CASCADE")
    assert holders(db) == ([], [])
    fresh = enqueue(db, "lane-a", "a-2")
    db.execute(CLAIM_BY_HAND, (300.0, fresh))
    assert holders(db) == ([("lane-a", fresh)], [("lane-a", fresh)])


def failures(db: OutboxTestDatabase) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    return (
        db.rows("SELECT action_id, state FROM {schema}.action_failure ORDER BY 1"),
        db.rows(
            "SELECT id, state FROM {schema}.agent_action "
            "WHERE state IN ('FAILED', 'UNCERTAIN') ORDER BY 1"
        ),
    )


async def test_action_failure_holds_exactly_the_failed_and_uncertain_actions(
    db: OutboxTestDatabase,
) -> None:
    """Endings in each state, an operator's resolution of an UNCERTAIN action as not done (it
    becomes FAILED), and deletes: after each, action_failure is the FAILED and UNCERTAIN
    actions, with their kinds and when they ended."""
    uncertain = await ended_by_executor(db, fence_then_uncertain, "u-1")
    resolved = await ended_by_executor(db, fence_then_uncertain, "u-2")
    ended = []
    for n, state in enumerate(["DONE", "FAILED", "CANCELLED", "UNCERTAIN"]):
        action_id = enqueue(db, f"lane-{n}", f"e-{n}")
        db.execute(CLAIM_BY_HAND, (300.0, action_id))
        db.execute(END_BY_HAND, (state, action_id))
        ended.append(action_id)
    side, actual = failures(db)
    assert side == actual
    assert {state for _, state in side} == {"FAILED", "UNCERTAIN"}
    async with await db.aconnect() as conn:
        await resolve_absent(conn, db.outbox, resolved, "not there", "ana")
    assert failures(db)[0] == failures(db)[1]
    assert (resolved, "FAILED") in failures(db)[0]
    db.execute("DELETE FROM {schema}.agent_action WHERE id = ANY(%s)", ([uncertain, *ended],))
    side, actual = failures(db)
    assert side == actual == [(resolved, "FAILED")]
    assert db.rows(
        "SELECT f.kind, f.ended_at = a.ended_at FROM {schema}.action_failure f "
        "JOIN {schema}.agent_action a ON a.id = f.action_id"
    ) == [("TEST_SCRIPTED", True)]


def test_the_counts_test_each_row_of_a_filtered_kind_and_name_only_the_others(
    db: OutboxTestDatabase,
) -> None:
    """backlog_counts works out whether a row is ours once a row: decodable_v1 for the kinds
    of KindFilter.filtered (a path or a key suffix to test), the kind's name for the others. Its
    counts, in both forms, are those of decodable_v1 over every live row: a row of a filtered
    kind that the filter refuses, and a kind this build does not serve, count as not ours."""
    with db.connect() as conn:
        for n in range(9):
            kind = ("TEST_NOOP", "TEST_SCRIPTED", "TEST_FENCED")[n % 3]
            key = f"k{n}:" + ("keep" if n % 2 else "drop")
            db.outbox.enqueue(conn, ActionRequest(kind, f"lane-{n % 4}", key, proposed=n == 7))
        conn.commit()
    # TEST_NOOP read through a key suffix, as a variant declared by ActionVariants.key_suffix;
    # TEST_SCRIPTED by its name; TEST_FENCED's rows are not this filter's.
    params = {
        "kinds": ["TEST_NOOP", "TEST_SCRIPTED"],
        "paths": [None, None],
        "suffixes": [r"(^|:)keep$", None],
        "filtered": ["TEST_NOOP"],
    }
    expected = sorted(
        db.rows(
            "SELECT CASE WHEN ours THEN kind END, count(*) FILTER (WHERE ours AND state = "
            "'ADMITTED'), count(*) FILTER (WHERE ours AND state = 'PROPOSED'), count(*) "
            "FROM (SELECT kind, state, {schema}.decodable_v1(kind, payload, idempotency_key, "
            "%(kinds)s::text[], %(paths)s::jsonpath[], %(suffixes)s::text[]) AS ours "
            "FROM {schema}.agent_action) a GROUP BY 1",
            params,
        ),
        key=repr,
    )
    # TEST_NOOP's are k0, k3 and k6, of which k3 keeps; TEST_SCRIPTED's k1, k4 and the
    # proposal k7, whatever their suffix; the rest are not ours: two of TEST_NOOP, TEST_FENCED's.
    assert expected == [("TEST_NOOP", 1, 0, 1), ("TEST_SCRIPTED", 2, 1, 3), (None, 0, 0, 5)]
    for scan in (False, True):
        answer = db.rows(
            db.outbox.queries["backlog_counts"], {**params, "scan": scan, "budget": None}
        )
        assert sorted(answer, key=repr) == expected, scan
    assert db.outbox.registry.filter(["TEST_NOOP"]).filtered == []


async def test_once_the_live_actions_pass_the_lanes_budget_the_next_counts_read_the_table_first(
    db: OutboxTestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor's full counts read at most the budget lane by lane, then the table. Once a
    count found the live actions over the budget, the next one reads the table at once (the
    budget read lane by lane would be spent again), until a count finds fewer."""
    monkeypatch.setattr(live_reads, "LANE_READ_BUDGET", 3)
    monkeypatch.setattr(live_reads, "by_table", lambda lane_bytes, action_bytes: False)
    first_reads: list[bool] = []
    acount_live = live_reads.acount_live

    async def spied(run: Any, scan: bool) -> tuple[live_reads.Counts, bool]:
        first_reads.append(scan)
        return await acount_live(run, scan)

    monkeypatch.setattr(live_reads, "acount_live", spied)
    with db.connect() as conn:
        for n in range(5):  # two lanes: two due heads, three actions waiting behind them
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", f"lane-{n % 2}", f"k{n}"))
        conn.commit()
    async with db.executor() as executor:
        assert (await executor.sample_backlog()).waiting == {"TEST_NOOP": 3}
        assert (await executor.sample_backlog()).waiting == {"TEST_NOOP": 3}
        with db.connect() as conn:
            for (action_id,) in db.rows(
                "SELECT id FROM {schema}.agent_action WHERE idempotency_key IN ('k2', 'k3', 'k4')"
            ):
                db.outbox.cancel(conn, action_id)
            conn.commit()
        assert (await executor.sample_backlog()).waiting == {}
        assert (await executor.sample_backlog()).waiting == {}
    # Lanes first (over the budget: the table then); the table at once while it finds five live
    # actions, and once more when it finds two; lanes again after that.
    assert first_reads == [False, True, True, False]


def test_the_passes_over_the_live_actions_count_the_same_by_lane_and_by_table(
    db: OutboxTestDatabase,
) -> None:
    """backlog_counts, blocked_lanes and retrying_actions read every live action lane by lane
    or in one pass over the table (outbox_core/live_reads.py chooses by size): both forms
    answer alike, over lanes with ended actions before their heads, a head in a backoff, a
    proposal, an executing head, each with actions behind it."""
    with db.connect() as conn:
        for n in range(3):  # ended actions below the heads, in every lane
            for lane in ("busy", "backoff", "proposed", "alone"):
                db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", lane, f"{lane}-old-{n}"))
        conn.commit()
    db.drain()
    with db.connect() as conn:
        for lane in ("busy", "backoff", "alone"):
            db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", lane, f"{lane}-head"))
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "proposed", "p-head", proposed=True))
        for lane in ("busy", "backoff", "proposed"):
            for n in range(2):
                db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", lane, f"{lane}-behind-{n}"))
        conn.commit()
    db.execute(
        CLAIM_BY_HAND.replace("WHERE id = %s", "WHERE idempotency_key = %s"),
        (300.0, "busy-head"),
    )
    db.execute(
        "UPDATE {schema}.agent_action SET due_at = now() + interval '1 hour', "
        "last_result = 'Retry' WHERE idempotency_key = 'backoff-head'"
    )
    params = db.outbox.registry.filter(["TEST_NOOP"]).params()
    answers = {}
    for scan in (False, True):
        answers[scan] = [
            sorted(
                db.rows(
                    db.outbox.queries[name],
                    {**params, "limit": 100, "scan": scan, "budget": None},
                )
            )
            for name in ("backlog_counts", "blocked_lanes", "retrying_actions")
        ]
    counts, blocked, retrying = answers[False]
    # Admitted, proposed, read: busy-head executes, p-head is proposed.
    assert counts == [("TEST_NOOP", 8, 1, 9)]
    assert live_reads.counted(counts, False) == {"TEST_NOOP": (8, 1)}
    assert sorted(row[1] for row in blocked) == ["backoff", "proposed"]
    assert [row[2] for row in retrying] == ["backoff"]
    assert answers[True] == answers[False]
    # Lane by lane, the counts stop at their budget of rows read: the caller reads the table.
    cut = db.rows(db.outbox.queries["backlog_counts"], {**params, "scan": False, "budget": 4})
    assert sum(row[3] for row in cut) == 4
    assert live_reads.counted(cut, False, budget=4) is None
    assert live_reads.counted(cut, True, budget=4) is not None  # the table is read whole


def test_a_claim_finds_a_long_lanes_head_without_reading_its_backlog(
    db: OutboxTestDatabase,
) -> None:
    """The search for a lane's first live action walks ix_agent_action_lane_id from head_id to
    the first live entry. With the statistics of a table of mostly ended actions (as retention
    keeps 30 days of them), the planner, which cannot know that the actions from head_id on are
    live, chose to read and sort the lane's whole backlog instead: 2,000 rows fetched to claim
    one. The claim and the due gauge must fetch a handful."""
    db.execute("ALTER TABLE {schema}.agent_action DISABLE TRIGGER USER")
    db.execute(
        "INSERT INTO {schema}.agent_action (kind, at_most_once, instance_level, lane_key, "
        "idempotency_key, max_attempts, state, stop_reason, ended_at) "
        "SELECT 'TEST_NOOP', false, true, 'old-' || (g % 2000), 'old-' || g, 5, 'DONE', "
        "'COMPLETED', now() FROM generate_series(1, 100000) g"
    )
    db.execute("ALTER TABLE {schema}.agent_action ENABLE TRIGGER USER")
    with db.connect() as conn:
        db.outbox.enqueue_many(
            conn, [ActionRequest("TEST_NOOP", "long", f"long-{n}") for n in range(2000)]
        )
        conn.commit()
    db.execute("ANALYZE {schema}.agent_action")
    kinds = db.outbox.registry.filter(["TEST_NOOP"])
    params = {"kinds": kinds.kinds, "paths": kinds.paths, "suffixes": kinds.suffixes}
    fetched = (
        "SELECT idx_tup_fetch FROM pg_stat_xact_user_tables "
        "WHERE schemaname = %s AND relname = 'agent_action'"
    )
    with db.connect() as conn:
        for query, extra in (("backlog_due", {"limit": 10}), ("claim", {"limit": 1})):
            before = conn.execute(fetched, (db.schema,)).fetchone()[0]  # type: ignore[index]
            rows = conn.execute(
                db.outbox.queries[query], {**params, **extra, "lease": 60.0, "traced": False}
            ).fetchall()
            after = conn.execute(fetched, (db.schema,)).fetchone()[0]  # type: ignore[index]
            assert rows, query
            assert after - before < 20, (query, after - before)
        conn.rollback()
