"""enqueue_many sends its batch as columns, each a list or one value for every request
(outbox_core/enqueue_rows.py): whatever the batch's shape (one kind or several, a field the
same for all or not, proposals among admitted actions, keys repeated), it writes the rows, the
lane rows and the answers that enqueue would, one request at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase

# The columns a request decides, as read back (due_at only where not_before sets it).
COLUMNS = (
    "kind, at_most_once, instance_level, workspace_id, lane_key, idempotency_key, payload, "
    "subject_account_id, state, max_attempts, expires_at"
)
# Times well after the test runs, and within the retention (an expiry beyond it is refused).
LATER = datetime.now(UTC) + timedelta(hours=1)


@st.composite
def requests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Requests as keyword arguments (without the key prefix each side adds), drawn so that each
    column is sometimes the same for the whole batch and sometimes not."""
    size = draw(st.integers(1, 12))
    same = draw(st.sets(st.sampled_from(["kind", "workspace", "subject", "attempts", "times"])))

    def column(name: str, values: st.SearchStrategy[Any]) -> list[Any]:
        if name in same:
            return [draw(values)] * size
        return [draw(values) for _ in range(size)]

    kinds = column("kind", st.sampled_from(["TEST_NOOP", "TEST_ONCE", "TEST_PAINT"]))
    workspaces = column("workspace", st.sampled_from([None, "ws-1", "ws-2"]))
    subjects = column("subject", st.sampled_from([None, "acct-1", "acct-ü"]))
    attempts = column("attempts", st.sampled_from([None, 1, 7]))
    times = column("times", st.sampled_from([None, 1, 2]))
    lanes = [draw(st.sampled_from(["a", "b", "c"])) for _ in range(size)]
    keys = [
        draw(st.sampled_from(["k1", "k2", "k3", "k4", "k5", "k6", "é", "z"])) for _ in range(size)
    ]
    proposed = [draw(st.booleans()) for _ in range(size)]
    out: list[dict[str, Any]] = []
    first: dict[str, dict[str, Any]] = {}
    for i in range(size):
        kind = kinds[i]
        request: dict[str, Any] = {
            "kind": kind,
            "lane_key": lanes[i],
            "idempotency_key": keys[i],
            "payload": {"color": "red"} if kind == "TEST_PAINT" else {"n": i},
            # A workspace kind needs one.
            "workspace_id": workspaces[i] or ("ws-0" if kind == "TEST_PAINT" else None),
            "subject_account_id": subjects[i],
            "max_attempts": attempts[i],
            "not_before": None if times[i] is None else LATER + timedelta(hours=times[i]),
            "expires_at": None if times[i] is None else LATER + timedelta(days=times[i] * 3),
            "proposed": proposed[i],
        }
        # A key repeated in a batch names the same effect (the first request's kind and lane).
        earlier = first.setdefault(keys[i], request)
        request["kind"], request["lane_key"] = earlier["kind"], earlier["lane_key"]
        request["payload"], request["workspace_id"] = earlier["payload"], earlier["workspace_id"]
        out.append(request)
    return out


def built(request: dict[str, Any], side: str) -> ActionRequest:
    return ActionRequest(
        **{
            **request,
            "lane_key": f"{side}:{request['lane_key']}",
            "idempotency_key": f"{side}:{request['idempotency_key']}",
        }
    )


def stored(db: OutboxTestDatabase, side: str) -> list[tuple[Any, ...]]:
    """The side's actions and lanes, in id order, with the side's prefix taken off."""
    actions = db.rows(
        f"SELECT {COLUMNS}, CASE WHEN due_at > created_at + interval '30 minutes' THEN due_at END "
        "FROM {schema}.agent_action WHERE lane_key LIKE %s ORDER BY id",
        (f"{side}:%",),
    )
    lanes = db.rows(
        "SELECT l.lane_key, l.next_at IS NULL, l.next_at > now() + interval '30 minutes', l.head_kind, "
        "a.idempotency_key FROM {schema}.action_lane l "
        "JOIN {schema}.agent_action a ON a.id = l.head_id WHERE l.lane_key LIKE %s "
        "ORDER BY l.lane_key",
        (f"{side}:%",),
    )
    strip = len(side) + 1
    return [(*row[:4], row[4][strip:], row[5][strip:], *row[6:]) for row in actions] + [
        (row[0][strip:], *row[1:4], row[4][strip:]) for row in lanes
    ]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=requests())
def test_enqueue_many_writes_what_enqueue_one_at_a_time_writes(
    db: OutboxTestDatabase, batch: list[dict[str, Any]]
) -> None:
    db.execute("DELETE FROM {schema}.agent_action")
    db.execute("DELETE FROM {schema}.action_lane")
    with db.connect() as conn:
        many = db.outbox.enqueue_many(conn, [built(request, "many") for request in batch])
        one = [db.outbox.enqueue(conn, built(request, "one")) for request in batch]
        conn.commit()
    assert [answer.created for answer in many] == [answer.created for answer in one]
    by_id_many = {answer.id for answer in many}
    assert len(by_id_many) == len({request["idempotency_key"] for request in batch})
    assert stored(db, "many") == stored(db, "one")


def test_a_key_that_exists_answers_its_action_in_a_batch_of_new_ones(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        old = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "b"))
        conn.commit()
        answers = db.outbox.enqueue_many(
            conn,
            [ActionRequest("TEST_NOOP", "lane", key) for key in ("a", "b", "c", "a")],
        )
        conn.commit()
    assert [a.created for a in answers] == [True, False, True, False]
    assert answers[1].id == old.id and answers[3].id == answers[0].id
    assert answers[0].id < answers[2].id  # drawn in the caller's order


# Mostly clean values (so that whole batches pass the columns), and each way of being wrong.
CLEAN = st.one_of(st.sampled_from(["lane", "k-1", "ü", "é" * 500, "x" * 1000]), st.text(min_size=1))
WRONG = st.sampled_from(["", " ", "\x00", "a\ud800", "é" * 501, "x" * 1001, 7])
TEXT = st.one_of(CLEAN, CLEAN, CLEAN, WRONG)
OPTIONAL = st.one_of(st.none(), TEXT)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(
        st.tuples(
            st.sampled_from(["TEST_NOOP", "TEST_NOOP", "TEST_PAINT"]),
            TEXT,
            TEXT,
            OPTIONAL,
            OPTIONAL,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_column_checks_pass_a_batch_only_when_each_request_passes(
    fields: list[tuple[str, Any, Any, Any, Any]],
) -> None:
    """The batch's column checks (enqueue_rows._clean_columns) restate the request check
    (checked_fields) for speed: they may send a clean batch to the request-by-request walk,
    never let a wrong request through, and agree on the attempts."""
    from outbox_core import KindRegistry
    from outbox_core.enqueue_rows import _clean_columns, checked_fields

    from .kinds import NoopAdapter, WorkspaceAdapter

    registry = KindRegistry()
    for adapter in (NoopAdapter, WorkspaceAdapter):
        registry.register(adapter)
    requests = [
        ActionRequest(kind, lane, key, workspace_id=workspace, subject_account_id=subject)
        for kind, lane, key, workspace, subject in fields
    ]
    entries = {request.kind: registry.get(request.kind) for request in requests}
    attempts = _clean_columns(requests, entries)
    if attempts is None:
        return
    # Each would raise InvalidRequest, naming its field, if the columns let a wrong one by.
    each = [checked_fields(r, entries[r.kind].adapter, None, 30.0) for r in requests]
    assert each == ([attempts] * len(requests) if isinstance(attempts, int) else attempts)
