"""The trigger guard_agent_action against the one table of transitions (states.TRANSITIONS)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext

import psycopg
import pytest

from outbox_core import ActionRequest, ActionState
from outbox_core.states import RESOLUTIONS, TRANSITIONS, allows
from outbox_core.testing import OutboxTestDatabase

ENDED_SET = "stop_reason = 'TEST', payload = NULL"


def put_in_state(
    conn: psycopg.Connection, db: OutboxTestDatabase, state: ActionState, key: str
) -> int:
    """An action of TEST_NOOP in ``state``, reached through allowed steps only."""
    proposed = state is ActionState.PROPOSED
    action_id = db.outbox.enqueue(
        conn, ActionRequest("TEST_NOOP", f"lane-{key}", key, proposed=proposed)
    ).id
    table = f'"{db.schema}".agent_action'
    if state in (ActionState.PROPOSED, ActionState.ADMITTED):
        return action_id
    conn.execute(
        f"UPDATE {table} SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, "
        "lease_until = now() + interval '5 minutes' WHERE id = %s",
        (action_id,),
    )
    if state is ActionState.UNCERTAIN:
        # As an attempt leaves it: its write started (the case a resolution is for).
        conn.execute(f"UPDATE {table} SET write_started_at = now() WHERE id = %s", (action_id,))
    if state is not ActionState.EXECUTING:
        conn.execute(
            f"UPDATE {table} SET state = %s, {ENDED_SET} WHERE id = %s", (str(state), action_id)
        )
    return action_id


# A well-formed update of an UNCERTAIN action into each state, as an operator's resolution
# writes it (outbox_core/operator.py); the other states get the executor's forms below.
RESOLVED_SET = {
    ActionState.DONE: "stop_reason = 'RESOLVED_DONE', readback_ref = 'ref', payload = NULL",
    ActionState.FAILED: "stop_reason = 'RESOLVED_ABSENT', payload = NULL",
    ActionState.ADMITTED: "payload = '{}', stop_reason = NULL, ended_at = NULL",
}


def write_audit(
    conn: psycopg.Connection, schema: str, action_id: int, old: ActionState, new: ActionState
) -> None:
    """The audit row an operator's change writes first, in its transaction."""
    conn.execute(
        f'INSERT INTO "{schema}".action_audit (action_id, actor, command, reason, surface, '
        "before_state, after_state) VALUES (%s, 'test', 'resolve', 'grid', 'api', %s, %s)",
        (action_id, str(old), str(new)),
    )


def try_update(
    conn: psycopg.Connection,
    table: str,
    action_id: int,
    old: ActionState,
    new: ActionState,
    audit: str | None = None,
) -> bool:
    """Try to move the row from ``old`` to ``new`` with a well-formed update; True if allowed.
    ``audit``: the schema in which an operator's audit row of the change is written first, in
    the same transaction."""
    if old is ActionState.UNCERTAIN and new in RESOLVED_SET:
        change = f"state = '{new}', {RESOLVED_SET[new]}"
    elif new is ActionState.EXECUTING:
        if old is ActionState.EXECUTING:
            # A reclaim needs an expired lease; the shortening is an in-place update.
            conn.execute(
                f"UPDATE {table} SET lease_until = now() - interval '1 second' WHERE id = %s",
                (action_id,),
            )
        change = "state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, lease_until = now() + interval '5 minutes'"
    elif new.ended:
        change = f"state = '{new}', {ENDED_SET}"
    elif old is new:
        change = "due_at = now() + interval '1 minute'"
    else:
        change = f"state = '{new}', lease_until = NULL"
    try:
        with conn.transaction():
            if audit is not None:
                write_audit(conn, audit, action_id, old, new)
            conn.execute(f"UPDATE {table} SET {change} WHERE id = %s", (action_id,))
    except psycopg.errors.CheckViolation:
        return False
    return True


def disagreements(
    db: OutboxTestDatabase,
    table: Mapping[ActionState, frozenset[ActionState]],
    *,
    audited: bool = False,
) -> list[tuple[ActionState, ActionState, bool]]:
    """Every ordered pair (same-state included) where the live trigger and ``table`` differ:
    (old, new, what the trigger did). ``audited``: each update is an operator's, with its
    audit row."""

    def expected(old: ActionState, new: ActionState) -> bool:
        return new in table[old] or (old is new and not old.ended)

    found = []
    with db.connect(autocommit=True) as conn:
        for number, (old, new) in enumerate(itertools.product(ActionState, ActionState)):
            action_id = put_in_state(conn, db, old, f"pair-{number}")
            did = try_update(
                conn,
                f'"{db.schema}".agent_action',
                action_id,
                old,
                new,
                audit=db.schema if audited else None,
            )
            if did != expected(old, new):
                found.append((old, new, did))
    return found


def test_every_ordered_pair_of_states_is_allowed_exactly_when_the_table_allows_it(
    db: OutboxTestDatabase,
) -> None:
    assert disagreements(db, TRANSITIONS) == []


def test_with_an_operators_audit_row_exactly_the_resolutions_are_allowed_besides(
    db: OutboxTestDatabase,
) -> None:
    with_resolutions = {state: TRANSITIONS[state] | RESOLUTIONS[state] for state in ActionState}
    assert disagreements(db, with_resolutions, audited=True) == []


def test_the_python_rule_allows_the_resolutions_only_as_a_resolution() -> None:
    assert RESOLUTIONS[ActionState.UNCERTAIN]
    for old in ActionState:
        for new in ActionState:
            if new in RESOLUTIONS[old]:
                assert not allows(old, new)
                assert allows(old, new, resolution=True)


def test_a_changed_table_disagrees_with_the_trigger_on_exactly_the_changed_pairs(
    db: OutboxTestDatabase,
) -> None:
    changed = dict(TRANSITIONS)
    changed[ActionState.DONE] = frozenset({ActionState.ADMITTED})
    changed[ActionState.ADMITTED] = frozenset({ActionState.EXECUTING})
    assert disagreements(db, changed) == [
        (ActionState.ADMITTED, ActionState.CANCELLED, True),
        (ActionState.DONE, ActionState.ADMITTED, False),
    ]


def test_the_python_rule_matches_the_table_for_same_state_updates() -> None:
    for state in ActionState:
        assert allows(state, state) is (not state.ended)


@pytest.fixture
def conn(db: OutboxTestDatabase):  # type: ignore[no-untyped-def]
    with db.connect(autocommit=True) as connection:
        yield connection


def table_of(db: OutboxTestDatabase) -> str:
    return f'"{db.schema}".agent_action'


def refused(conn: psycopg.Connection, query: str, params: tuple[object, ...], match: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match=match):
        conn.execute(query, params)


@pytest.mark.parametrize("ended", sorted(s for s in ActionState if s.ended))
@pytest.mark.parametrize(
    "change",
    ["readback_ref = 'x'", "stop_reason = 'OTHER'", "due_at = now()", "attempt = attempt"],
)
def test_an_ended_action_never_changes(
    db: OutboxTestDatabase, conn: psycopg.Connection, ended: ActionState, change: str
) -> None:
    action_id = put_in_state(conn, db, ended, "ended")
    refused(
        conn, f"UPDATE {table_of(db)} SET {change} WHERE id = %s", (action_id,), "never changes"
    )


@pytest.mark.parametrize("ended", sorted(s for s in ActionState if s.ended))
def test_ending_keeps_no_payload_and_names_a_stop_reason(
    db: OutboxTestDatabase, conn: psycopg.Connection, ended: ActionState
) -> None:
    action_id = put_in_state(conn, db, ActionState.EXECUTING, "ending")
    table = table_of(db)
    refused(
        conn,
        f"UPDATE {table} SET state = %s, stop_reason = 'X' WHERE id = %s",
        (str(ended), action_id),
        "keeps no payload",
    )
    refused(
        conn,
        f"UPDATE {table} SET state = %s, payload = NULL WHERE id = %s",
        (str(ended), action_id),
        "has a stop_reason",
    )
    conn.execute(
        f"UPDATE {table} SET state = %s, payload = NULL, stop_reason = 'X' WHERE id = %s",
        (str(ended), action_id),
    )
    row = conn.execute(
        f"SELECT payload, stop_reason, ended_at IS NOT NULL FROM {table} WHERE id = %s",
        (action_id,),
    ).fetchone()
    assert row == (None, "X", True)


def test_an_at_most_once_action_whose_write_started_is_never_claimed_again(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    table = table_of(db)
    action_id = db.outbox.enqueue(conn, ActionRequest("TEST_ONCE", "lane", "once")).id
    conn.execute(
        f"UPDATE {table} SET state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now() - interval '1 s', write_started_at = now() WHERE id = %s",
        (action_id,),
    )
    refused(
        conn,
        f"UPDATE {table} SET epoch = 2, attempt = 2, lease_until = now() + interval '1 min' WHERE id = %s",
        (action_id,),
        "never claimed again",
    )
    # Back to ADMITTED with the write still marked (a Defer after an earlier write): no claim either.
    conn.execute(
        f"UPDATE {table} SET state = 'ADMITTED', lease_until = NULL WHERE id = %s", (action_id,)
    )
    refused(
        conn,
        f"UPDATE {table} SET state = 'EXECUTING', epoch = 2, attempt = 2 WHERE id = %s",
        (action_id,),
        "never claimed again",
    )


def test_a_read_back_kind_is_claimed_again_after_its_write_started(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    table = table_of(db)
    action_id = put_in_state(conn, db, ActionState.EXECUTING, "reread")
    conn.execute(
        f"UPDATE {table} SET lease_until = now() - interval '1 s', write_started_at = now() WHERE id = %s",
        (action_id,),
    )
    conn.execute(
        f"UPDATE {table} SET epoch = epoch + 1, attempt = attempt + 1, lease_until = now() + interval '1 min' WHERE id = %s",
        (action_id,),
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("epoch = epoch + 2, attempt = attempt + 1", "raises the epoch and the attempt by one"),
        ("epoch = epoch + 1, attempt = attempt", "raises the epoch and the attempt by one"),
        ("epoch = epoch + 1, attempt = attempt + 1", "cannot be claimed again before"),
        ("epoch = epoch - 1", "never falls"),
    ],
)
def test_claims_raise_the_epoch_by_one_and_never_before_the_lease_ends(
    db: OutboxTestDatabase, conn: psycopg.Connection, change: str, match: str
) -> None:
    action_id = put_in_state(conn, db, ActionState.EXECUTING, "epoch")
    refused(conn, f"UPDATE {table_of(db)} SET {change} WHERE id = %s", (action_id,), match)


def test_only_a_claim_changes_the_epoch(db: OutboxTestDatabase, conn: psycopg.Connection) -> None:
    action_id = put_in_state(conn, db, ActionState.ADMITTED, "epoch-admitted")
    refused(
        conn,
        f"UPDATE {table_of(db)} SET epoch = epoch + 1 WHERE id = %s",
        (action_id,),
        "only a claim",
    )


def test_a_workspace_kind_needs_a_workspace_and_an_instance_level_kind_does_not(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    insert = (
        f"INSERT INTO {table_of(db)} (kind, at_most_once, instance_level, workspace_id, lane_key, "
        "idempotency_key, payload, max_attempts) VALUES (%s, false, %s, %s, 'l', %s, '{}', 1)"
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="ck_agent_action_workspace"):
        conn.execute(insert, ("TEST_PAINT", False, None, "paint-1"))
    conn.execute(insert, ("TEST_PAINT", False, "ws-1", "paint-2"))
    conn.execute(insert, ("TEST_NOOP", True, None, "noop-1"))


def test_the_kind_flags_on_a_row_must_be_the_registrys(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="fk_agent_action_kind"):
        conn.execute(
            f"INSERT INTO {table_of(db)} (kind, at_most_once, instance_level, lane_key, idempotency_key, max_attempts) "
            "VALUES ('TEST_NOOP', true, true, 'l', 'liar', 1)"
        )


@pytest.mark.parametrize(
    "state", sorted(s for s in ActionState if s not in (ActionState.PROPOSED, ActionState.ADMITTED))
)
def test_a_new_action_is_proposed_or_admitted(
    db: OutboxTestDatabase, conn: psycopg.Connection, state: ActionState
) -> None:
    refused(
        conn,
        f"INSERT INTO {table_of(db)} (kind, at_most_once, instance_level, lane_key, idempotency_key, max_attempts, state, stop_reason) "
        "VALUES ('TEST_NOOP', false, true, 'l', %s, 1, %s, 'X')",
        (f"new-{state}", str(state)),
        "is PROPOSED or ADMITTED",
    )


# -- the guard's fast path (migration 0006) ---------------------------------------------------

GUARD = "guard_agent_action"


def starting_rows(conn: psycopg.Connection, db: OutboxTestDatabase) -> dict[str, int]:
    """Actions in the states an update can start from, including the at-most-once cases."""
    table = table_of(db)
    rows = {
        "proposed": put_in_state(conn, db, ActionState.PROPOSED, "fast-proposed"),
        "admitted": put_in_state(conn, db, ActionState.ADMITTED, "fast-admitted"),
        "retried": put_in_state(conn, db, ActionState.EXECUTING, "fast-retried"),
        "executing": put_in_state(conn, db, ActionState.EXECUTING, "fast-executing"),
        "expired": put_in_state(conn, db, ActionState.EXECUTING, "fast-expired"),
        "fenced": put_in_state(conn, db, ActionState.EXECUTING, "fast-fenced"),
    }
    conn.execute(f"UPDATE {table} SET write_started_at = now() WHERE id = %s", (rows["fenced"],))
    conn.execute(
        f"UPDATE {table} SET lease_until = now() - interval '1 s' WHERE id = %s",
        (rows["expired"],),
    )
    conn.execute(  # back to ADMITTED after a retry: epoch 1, attempt 1
        f"UPDATE {table} SET state = 'ADMITTED', lease_until = NULL WHERE id = %s",
        (rows["retried"],),
    )
    for name, state in (("once_admitted", "ADMITTED"), ("once_executing", "EXECUTING")):
        action_id = db.outbox.enqueue(conn, ActionRequest("TEST_ONCE", f"lane-{name}", name)).id
        conn.execute(
            f"UPDATE {table} SET state = 'EXECUTING', epoch = 1, attempt = 1, "
            "lease_until = now() - interval '1 s', write_started_at = now() WHERE id = %s",
            (action_id,),
        )
        if state == "ADMITTED":
            conn.execute(
                f"UPDATE {table} SET state = 'ADMITTED', lease_until = NULL WHERE id = %s",
                (action_id,),
            )
        rows[name] = action_id
    return rows


LEASES = {
    "kept": None,
    "moved": "lease_until = now() + interval '5 minutes'",
    "cleared": "lease_until = NULL",
}
MARKS = {"kept": None, "cleared": "write_started_at = NULL", "set": "write_started_at = now()"}


def updates() -> list[str]:
    """A grid of updates around the shapes the fast path takes (a claim, an ending, an update
    at the same epoch): the attempt raised, kept, given back or lowered by two, the lease
    kept, moved or cleared, and the fence's mark kept, cleared or set."""
    found = []
    for state, epoch, attempt, lease, mark, stop, payload, ended, lane in itertools.product(
        ActionState,
        (0, 1, 2),
        (-2, -1, 0, 1),
        LEASES,
        MARKS,
        (False, True),
        (False, True),
        (False, True),
        (False, True),
    ):
        if lane and (stop or payload or lease != "kept" or mark != "kept"):  # fewer neighbours
            continue
        if (lease != "kept" or mark != "kept") and not stop == payload == ended:
            continue  # with an ending's columns, or none
        if lease != "kept" and mark != "kept":
            continue
        change = [
            f"state = '{state}'",
            f"epoch = epoch + {epoch}",
            f"attempt = attempt + ({attempt})",
        ]
        change += [LEASES[lease]] if LEASES[lease] else []
        change += [MARKS[mark]] if MARKS[mark] else []
        change += ["stop_reason = 'X'"] if stop else []
        change += ["payload = NULL"] if payload else []
        change += ["ended_at = now()"] if ended else []
        change += ["lane_key = lane_key || '-moved'"] if lane else []
        found.append(", ".join(change))
    return found


def verdicts(
    conn: psycopg.Connection, table: str, rows: Mapping[str, int]
) -> dict[tuple[str, str], tuple[object, ...] | str]:
    """What each update does to each starting row: the row it leaves, or the error's message.
    Every update is rolled back."""
    found: dict[tuple[str, str], tuple[object, ...] | str] = {}
    for name, action_id in rows.items():
        for change in updates():
            try:
                with conn.transaction(force_rollback=True):
                    found[(name, change)] = (
                        conn.execute(
                            f"UPDATE {table} SET {change} WHERE id = %s RETURNING state, epoch, "
                            "attempt, stop_reason, payload, ended_at IS NOT NULL, lane_key",
                            (action_id,),
                        ).fetchone()
                        or ()
                    )
            except psycopg.errors.CheckViolation as exc:
                # The primary message only: a table CHECK's detail shows the row, with now().
                found[(name, change)] = exc.diag.message_primary or str(exc)
    return found


@contextmanager
def without_fast_path(conn: psycopg.Connection, db: OutboxTestDatabase) -> Iterator[None]:
    """The guard trigger recreated without its WHEN clause (every update runs the function),
    in a transaction that is rolled back."""
    table = table_of(db)
    with conn.transaction(force_rollback=True):
        conn.execute(f"DROP TRIGGER {GUARD} ON {table}")
        conn.execute(
            f"CREATE TRIGGER {GUARD} BEFORE UPDATE ON {table} FOR EACH ROW "
            f'EXECUTE FUNCTION "{db.schema}".{GUARD}()'
        )
        yield


def test_the_fast_path_lets_through_exactly_what_the_guard_function_does(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    table = table_of(db)
    rows = starting_rows(conn, db)
    with_when = verdicts(conn, table, rows)
    # The same grid against the function alone: the trigger recreated without its WHEN clause.
    with without_fast_path(conn, db):
        function_only = verdicts(conn, table, rows)
    assert with_when == function_only
    allowed = [key for key, verdict in with_when.items() if not isinstance(verdict, str)]
    refused = [key for key, verdict in with_when.items() if isinstance(verdict, str)]
    assert len(allowed) > 100 and len(refused) > 5000  # the grid reaches both sides
    # The forms of a same-epoch update are in the grid, on both sides.
    executing = [change for (name, change) in allowed if name == "executing"]
    assert (
        "state = 'EXECUTING', epoch = epoch + 0, attempt = attempt + (0), " + LEASES["moved"]
        in executing
    )
    assert (
        "expired",
        "state = 'EXECUTING', epoch = epoch + 0, attempt = attempt + (1), " + LEASES["moved"],
    ) in refused


def guard_calls(conn: psycopg.Connection, schema: str) -> int:
    return conn.execute(
        "SELECT coalesce(pg_stat_get_xact_function_calls(p.oid), 0) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s",
        (schema, GUARD),
    ).fetchone()[0]  # type: ignore[index]


def test_claims_fences_and_endings_skip_the_guard_function_and_other_updates_call_it(
    db: OutboxTestDatabase, conn: psycopg.Connection
) -> None:
    table = table_of(db)
    action_id = put_in_state(conn, db, ActionState.ADMITTED, "fast-calls")
    expiring = put_in_state(conn, db, ActionState.ADMITTED, "slow-calls")
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'pl'")
        conn.execute(
            f"UPDATE {table} SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, "
            "lease_until = now() + interval '1 min' WHERE id = %s",
            (action_id,),
        )
        conn.execute(
            f"UPDATE {table} SET write_started_at = now() WHERE id = %s AND state = 'EXECUTING'",
            (action_id,),
        )
        conn.execute(
            f"UPDATE {table} SET state = 'DONE', {ENDED_SET}, ended_at = now() WHERE id = %s",
            (action_id,),
        )
        assert guard_calls(conn, db.schema) == 0
        conn.execute(  # an expiry: not a fast path
            f"UPDATE {table} SET state = 'CANCELLED', {ENDED_SET} WHERE id = %s", (expiring,)
        )
        assert guard_calls(conn, db.schema) == 1


LEASE = "lease_until = now() + interval '5 minutes'"
ENDING = f"state = 'DONE', {ENDED_SET}, ended_at = now()"

# Updates at the same epoch, on the rows of starting_rows(): (row, change, refusal or None).
SAME_EPOCH_FORMS = [
    # The reported form: a reclaim without a new epoch, after which the old holder's writes
    # (naming epoch 1) would still apply.
    ("expired", f"state = 'EXECUTING', attempt = attempt + 1, {LEASE}", "raises the attempt"),
    ("executing", "attempt = attempt + 1", "raises the attempt"),
    ("admitted", "attempt = attempt + 1", "raises the attempt"),
    ("proposed", "attempt = attempt + 1", "raises the attempt"),
    ("executing", "state = 'ADMITTED', attempt = attempt + 1, lease_until = NULL", "raises"),
    ("executing", f"{ENDING}, attempt = attempt + 1", "raises the attempt"),
    ("executing", "state = 'ADMITTED', attempt = attempt - 2, lease_until = NULL", "one attempt"),
    ("admitted", LEASE, "moves its lease"),
    ("retried", LEASE, "moves its lease"),
    ("proposed", LEASE, "moves its lease"),
    ("executing", f"{ENDING}, {LEASE}", "moves its lease"),
    ("executing", f"{ENDING}, lease_until = NULL", "moves its lease"),
    ("executing", "state = 'ADMITTED', lease_until = now() + interval '1 minute'", "moves"),
    # What the executor does at the same epoch, allowed.
    ("executing", LEASE, None),  # a lease renewal
    ("expired", LEASE, None),  # a renewal by the holder that the lease outlived
    ("executing", "lease_until = now() + interval '30 seconds', last_result = 'Reread'", None),
    ("executing", "lease_until = now()", None),  # drain() ends a Reread's wait
    ("executing", "write_started_at = now()", None),  # a fence
    # A Defer and a shutdown's give-back: the attempt given back, due now.
    (
        "executing",
        "state = 'ADMITTED', attempt = attempt - 1, lease_until = NULL, due_at = now()",
        None,
    ),
    ("executing", "state = 'ADMITTED', lease_until = NULL, due_at = now() + interval '1 s'", None),
    ("executing", ENDING, None),
    ("retried", "due_at = now()", None),  # drain() makes it due
    ("admitted", f"state = 'CANCELLED', {ENDED_SET}", None),  # expiry, cancel
    ("proposed", "state = 'ADMITTED', due_at = now()", None),  # admit
    # Claims raise the epoch with the attempt.
    ("expired", f"state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, {LEASE}", None),
    ("retried", f"state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, {LEASE}", None),
]

# The fence's mark, on the rows of starting_rows(): (row, change, refusal or None).
MARK_FORMS = [
    # Cleared on an executing at-most-once action, a claim could take it again after its
    # write started.
    ("once_executing", "write_started_at = NULL", "that mark stays"),
    ("fenced", "write_started_at = NULL", "that mark stays"),
    ("fenced", "write_started_at = now() + interval '1 s'", "that mark stays"),
    ("once_admitted", "write_started_at = NULL", "that mark stays"),
    ("fenced", "write_started_at = coalesce(write_started_at, now())", None),  # a fence again
    ("executing", "write_started_at = coalesce(write_started_at, now())", None),  # a fence
    ("fenced", "state = 'ADMITTED', lease_until = NULL, write_started_at = NULL", None),  # Retry
    ("fenced", "state = 'ADMITTED', attempt = attempt - 1, lease_until = NULL", None),  # Defer
]


def verdict_is(
    db: OutboxTestDatabase,
    conn: psycopg.Connection,
    fast_path: bool,
    row: str,
    change: str,
    refusal: str | None,
) -> None:
    """The update is allowed (refusal None) or refused with that message, on either path."""
    rows = starting_rows(conn, db)
    query = f"UPDATE {table_of(db)} SET {change} WHERE id = %s"
    with nullcontext() if fast_path else without_fast_path(conn, db):
        if refusal is None:
            with conn.transaction(force_rollback=True):
                assert conn.execute(query + " RETURNING id", (rows[row],)).fetchone()
        else:
            with conn.transaction(force_rollback=True):
                refused(conn, query, (rows[row],), refusal)


PATHS = pytest.mark.parametrize(
    "fast_path", [True, False], ids=["with the WHEN clause", "function only"]
)


@PATHS
@pytest.mark.parametrize(("row", "change", "refusal"), SAME_EPOCH_FORMS)
def test_only_a_claim_raises_the_attempt_and_only_a_holder_that_stays_executing_moves_the_lease(
    db: OutboxTestDatabase,
    conn: psycopg.Connection,
    fast_path: bool,
    row: str,
    change: str,
    refusal: str | None,
) -> None:
    verdict_is(db, conn, fast_path, row, change, refusal)


@PATHS
@pytest.mark.parametrize(("row", "change", "refusal"), MARK_FORMS)
def test_the_fence_mark_once_set_stays_while_the_state_does(
    db: OutboxTestDatabase,
    conn: psycopg.Connection,
    fast_path: bool,
    row: str,
    change: str,
    refusal: str | None,
) -> None:
    verdict_is(db, conn, fast_path, row, change, refusal)
