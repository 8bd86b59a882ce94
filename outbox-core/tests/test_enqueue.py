"""enqueue: in the caller's transaction, idempotent (also under concurrency), validated."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import set_json_dumps
from pydantic import BaseModel, SecretStr

from outbox_core import (
    ActionAdapter,
    ActionRequest,
    ActionVariants,
    Done,
    IdempotencyConflict,
    InvalidRequest,
    UnknownKind,
)
from outbox_core.testing import OutboxTestDatabase

from .kinds import Step


def count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def test_the_action_exists_exactly_when_the_callers_transaction_commits(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "rolled-back"))
        conn.rollback()
        assert count(db) == 0
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "committed"))
        assert count(db) == 0
        conn.commit()
    assert count(db) == 1


def test_a_second_enqueue_with_the_same_key_returns_the_first_action_and_changes_nothing(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn:
        first = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "k", payload={"n": 1}))
        second = db.outbox.enqueue(
            conn, ActionRequest("TEST_NOOP", "lane", "k", payload={"n": 2}, max_attempts=9)
        )
        conn.commit()
    assert first.created and not second.created
    assert second.id == first.id
    assert db.rows("SELECT payload, max_attempts FROM {schema}.agent_action") == [({"n": 1}, 5)]


def _enqueue_in_thread(db: OutboxTestDatabase, key: str, out: dict[str, Any]) -> threading.Thread:
    def work() -> None:
        with db.connect() as conn:
            out["result"] = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", key))
            conn.commit()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def _wait_until_blocked(db: OutboxTestDatabase) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        waiting = db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        if waiting:
            return
        time.sleep(0.01)
    raise AssertionError("the second enqueue never waited on the first")


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_concurrent_enqueues_of_one_key_leave_one_row_and_both_callers_get_it(
    db: OutboxTestDatabase, first_commits: bool
) -> None:
    out: dict[str, Any] = {}
    with db.connect() as first:
        mine = db.outbox.enqueue(first, ActionRequest("TEST_NOOP", "lane", "contested"))
        thread = _enqueue_in_thread(db, "contested", out)
        _wait_until_blocked(db)
        if first_commits:
            first.commit()
        else:
            first.rollback()
    thread.join(10)
    theirs = out["result"]
    assert count(db) == 1
    stored = db.scalar("SELECT id FROM {schema}.agent_action")
    if first_commits:
        assert (theirs.id, theirs.created) == (mine.id, False)
    else:
        assert theirs.created and theirs.id == stored
    assert stored == (mine.id if first_commits else theirs.id)


def test_bulk_enqueue_answers_in_request_order_in_one_round_trip(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        existing = db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane-0", "bulk-0"))
        requests = [
            ActionRequest("TEST_NOOP", f"lane-{i % 7}", f"bulk-{i}", payload={"n": i})
            for i in range(500)
        ]
        requests.append(ActionRequest("TEST_NOOP", "lane-3", "bulk-3"))  # a repeat inside the batch
        answers = db.outbox.enqueue_many(conn, requests)
        conn.commit()
    assert answers[0].id == existing.id and not answers[0].created
    assert all(a.created for a in answers[1:500])
    assert answers[500].id == answers[3].id and not answers[500].created
    ids = [a.id for a in answers[1:500]]
    assert ids == sorted(ids)
    assert count(db) == 500
    assert db.scalar("SELECT count(*) FROM {schema}.action_lane") == 7


async def test_the_async_twins_enqueue_in_the_callers_transaction(db: OutboxTestDatabase) -> None:
    conn = await db.aconnect()
    async with conn:
        one = await db.outbox.aenqueue(conn, ActionRequest("TEST_NOOP", "lane", "async-1"))
        many = await db.outbox.aenqueue_many(
            conn, [ActionRequest("TEST_NOOP", "lane", f"async-{i}") for i in (1, 2)]
        )
        await conn.commit()
    assert one.created and many[0] == type(one)(one.id, False) and many[1].created
    assert count(db) == 2


class Secretive(BaseModel):
    token: SecretStr
    count: int


class SecretAdapter(ActionAdapter):
    kind = "TEST_SECRET"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Secretive)

    async def execute(self, attempt: Any) -> Done:
        return Done()


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (
            ActionRequest("NO_SUCH_KIND", "l", "k"),
            UnknownKind,
            "NO_SUCH_KIND: no installed plugin registers it; installed kinds: .*TEST_NOOP",
        ),
        (
            ActionRequest("TEST_NOOP", "l", "k", payload={"n": "many"}),
            InvalidRequest,
            r"payload: TEST_NOOP refuses it: payload\.n: Input should be a valid integer",
        ),
        (
            ActionRequest("TEST_NOOP", "l", "k", max_attempts=0),
            InvalidRequest,
            "max_attempts: must be an integer from 1 to 2147483647, got 0",
        ),
        (
            ActionRequest("TEST_NOOP", "l", "k", expires_at=datetime(2000, 1, 1, tzinfo=UTC)),
            InvalidRequest,
            "expires_at: 2000-01-01T00:00:00\\+00:00 has already passed",
        ),
        (
            ActionRequest("TEST_NOOP", "l", "k", expires_at=datetime(2100, 1, 1)),
            InvalidRequest,
            "expires_at: must be a timezone-aware datetime",
        ),
        (
            ActionRequest("TEST_NOOP", "", "k"),
            InvalidRequest,
            "lane_key: must be a non-empty string",
        ),
        (
            ActionRequest("TEST_NOOP", "l", "  "),
            InvalidRequest,
            "idempotency_key: must be a non-empty string",
        ),
        (
            ActionRequest("TEST_PAINT", "l", "k", payload={"color": "red"}),
            InvalidRequest,
            "workspace_id: TEST_PAINT is not an instance-level kind",
        ),
        (
            ActionRequest("TEST_PAINT", "l", "k", payload={"color": "green"}, workspace_id="w"),
            InvalidRequest,
            r"payload\.color: Input should be 'red' or 'blue'",
        ),
        (
            ActionRequest("TEST_NOOP", "other-lane", "taken"),
            IdempotencyConflict,
            "'taken' already names action .* \\(TEST_NOOP in lane 'lane'\\); this request is TEST_NOOP in lane 'other-lane'",
        ),
        (
            ActionRequest("TEST_FENCED", "lane", "taken"),
            IdempotencyConflict,
            "this request is TEST_FENCED in lane 'lane'",
        ),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_writes_nothing(
    db: OutboxTestDatabase, request_: ActionRequest, error: type[Exception], message: str
) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "taken"))
        conn.commit()
        before = db.rows("SELECT * FROM {schema}.agent_action ORDER BY id")
        with pytest.raises(error, match=message):
            db.outbox.enqueue(conn, request_)
        with pytest.raises(error, match=message):
            db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "fine"), request_])
        # The caller's transaction is still usable, and nothing was written.
        conn.execute("SELECT 1")
        conn.commit()
    assert db.rows("SELECT * FROM {schema}.agent_action ORDER BY id") == before


def test_a_refused_payload_never_echoes_its_values(db: OutboxTestDatabase) -> None:
    db.register_kind(SecretAdapter)
    with db.connect() as conn, pytest.raises(InvalidRequest) as caught:
        db.outbox.enqueue(
            conn,
            ActionRequest(
                "TEST_SECRET",
                "l",
                "k",
                payload={"token": "hunter2-secret", "count": "lots-of-hunter2"},
            ),
        )
    assert "hunter2" not in str(caught.value)
    assert "payload.count: Input should be a valid integer" in str(caught.value)


def test_a_key_used_twice_in_one_batch_for_different_effects_is_refused(
    db: OutboxTestDatabase,
) -> None:
    with db.connect() as conn, pytest.raises(IdempotencyConflict, match="used twice in this batch"):
        db.outbox.enqueue_many(
            conn, [ActionRequest("TEST_NOOP", "a", "same"), ActionRequest("TEST_NOOP", "b", "same")]
        )
    assert count(db) == 0


def test_expiry_is_judged_by_the_database_clock(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        db.outbox.enqueue(
            conn, ActionRequest("TEST_NOOP", "l", "soon", expires_at=now + timedelta(minutes=1))
        )
        with pytest.raises(InvalidRequest, match="already passed"):
            db.outbox.enqueue(
                conn, ActionRequest("TEST_NOOP", "l", "late", expires_at=now - timedelta(seconds=1))
            )
        conn.commit()
    assert count(db) == 1


def test_a_model_instance_is_accepted_as_the_payload(db: OutboxTestDatabase) -> None:
    with db.connect() as conn:
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "l", "model", payload=Step(n=3)))
        conn.commit()
    assert db.scalar("SELECT payload FROM {schema}.agent_action") == {"n": 3, "note": None}


def test_an_expiry_beyond_the_retention_of_ended_actions_is_refused_and_writes_nothing(
    db: OutboxTestDatabase,
) -> None:
    # An ended action keeps its idempotency key for the retention (30 days), so a late
    # redelivery up to the expiry still finds it; an expiry further out could not hold that.
    with db.connect() as conn:
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        too_late = ActionRequest(
            "TEST_NOOP", "l", "too-late", expires_at=now + timedelta(days=30, minutes=1)
        )
        message = r"expires_at: .* is further out than the retention of ended actions \(30 days"
        with pytest.raises(InvalidRequest, match=message):
            db.outbox.enqueue(conn, too_late)
        with pytest.raises(InvalidRequest, match=message):
            db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "l", "fine"), too_late])
        conn.commit()
        assert count(db) == 0
        # Up to the retention is fine, and a longer retention allows a longer expiry.
        db.outbox.enqueue(
            conn,
            ActionRequest("TEST_NOOP", "l", "in-time", expires_at=now + timedelta(days=29)),
        )
        db.configure(retention_days=60)
        db.outbox.enqueue_many(conn, [too_late])
        conn.commit()
    assert count(db) == 2


async def test_an_async_enqueue_refuses_an_expiry_beyond_the_retention_too(
    db: OutboxTestDatabase,
) -> None:
    conn = await db.aconnect()
    async with conn:
        now = (await (await conn.execute("SELECT now()")).fetchone())[0]  # type: ignore[index]
        too_late = ActionRequest("TEST_NOOP", "l", "too-late", expires_at=now + timedelta(days=31))
        with pytest.raises(InvalidRequest, match="further out than the retention"):
            await db.outbox.aenqueue(conn, too_late)
        with pytest.raises(InvalidRequest, match="further out than the retention"):
            await db.outbox.aenqueue_many(conn, [ActionRequest("TEST_NOOP", "l", "ok"), too_late])
        await conn.commit()
    assert count(db) == 0


def test_a_batch_exists_exactly_when_the_callers_transaction_commits(
    db: OutboxTestDatabase,
) -> None:
    # enqueue_many first in a transaction: its savepoint must not commit the batch itself.
    with db.connect() as conn:
        db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "rolled-back")])
        conn.rollback()
        assert count(db) == 0
        db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "committed")])
        assert count(db) == 0
        conn.commit()
    assert count(db) == 1
    with db.connect(autocommit=True) as conn:
        # In autocommit mode the batch is a transaction of its own, as a single enqueue is.
        db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "autocommit")])
    assert count(db) == 2


async def test_an_async_batch_exists_exactly_when_the_callers_transaction_commits(
    db: OutboxTestDatabase,
) -> None:
    conn = await db.aconnect()
    async with conn:
        await db.outbox.aenqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "rolled-back")])
        await conn.rollback()
        assert count(db) == 0
        await db.outbox.aenqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "committed")])
        assert count(db) == 0
        await conn.commit()
    assert count(db) == 1


def test_a_key_repeated_in_a_batch_keeps_its_first_request(db: OutboxTestDatabase) -> None:
    # Keys out of byte order, and the repeat's first request after a later key: the batch
    # inserts in key order, and still keeps the first request of a repeated key.
    requests = [
        ActionRequest("TEST_NOOP", "lane", key, payload={"n": n})
        for key, n in (("b", 1), ("c", 2), ("a", 3), ("c", 4), ("é", 5), ("z", 6))
    ]
    with db.connect() as conn:
        answers = db.outbox.enqueue_many(conn, requests)
        conn.commit()
    assert [a.created for a in answers] == [True, True, True, False, True, True]
    assert answers[3].id == answers[1].id
    assert db.rows(
        "SELECT idempotency_key, payload->>'n' FROM {schema}.agent_action ORDER BY id"
    ) == [("b", "1"), ("c", "2"), ("a", "3"), ("é", "5"), ("z", "6")]


def test_both_enqueues_dump_payloads_with_the_json_dumps_psycopg_is_configured_with(
    db: OutboxTestDatabase,
) -> None:
    # A payload holds JSON values only (enqueue refuses a Decimal, which would not read back
    # as it went in), so the application's encoder is seen by what it is handed.
    handed: list[object] = []

    def dumps(value: object) -> str:
        handed.append(value)
        return json.dumps(value)

    with db.connect() as conn:
        set_json_dumps(dumps, context=conn)
        db.outbox.enqueue(conn, ActionRequest("TEST_NOOP", "lane", "one", {"n": 1}))
        db.outbox.enqueue_many(conn, [ActionRequest("TEST_NOOP", "lane", "many", {"n": 2})])
        conn.commit()
    # Each statement's one JSON parameter: the single request's array, the batch's columns.
    assert any(isinstance(value, list) and {"n": 1} in value for value in handed)
    assert any(isinstance(value, dict) and value.get("payload") == [{"n": 2}] for value in handed)
    assert db.rows("SELECT payload->>'n' FROM {schema}.agent_action ORDER BY id") == [
        ("1",),
        ("2",),
    ]
