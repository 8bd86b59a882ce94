"""A kind's own enqueue check (``check_enqueue`` and ``acheck_enqueue``) runs on every enqueue
path for its kind, before anything is written: ``enqueue``, ``enqueue_many`` (one refused
request refuses the batch), ``admit`` and ``check``; a kind without one is never called."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from psycopg import AsyncConnection, Connection

from outbox_core import (
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionState,
    ActionVariants,
    AdapterResult,
    Done,
    EnqueueCheck,
    InvalidRequest,
    RegistrationError,
)
from outbox_core.registry import KindRegistry
from outbox_core.steps import NeedsAsync
from outbox_core.testing import OutboxTestDatabase

from .kinds import Step

OPTED_OUT = "optout"


class Refused(InvalidRequest):
    """What the checking kind raises."""


class CheckedAdapter(ActionAdapter):
    """Refuses requests addressed to an account listed in the ``opted_out`` table, which it reads
    through the caller's connection (so rows of the caller's transaction count)."""

    kind = "TEST_CHECKED"
    instance_level = True
    seen: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    @classmethod
    def check_enqueue(cls, conn: Connection[Any], check: EnqueueCheck) -> None:
        cls.seen.append(("sync", check.request.idempotency_key))
        assert isinstance(check.body, Step) and check.payload == {"n": check.body.n}
        row = conn.execute(
            "SELECT 1 FROM opted_out WHERE account = %s", (check.request.subject_account_id,)
        ).fetchone()
        cls._decide(row is not None, check)

    @classmethod
    async def acheck_enqueue(cls, conn: AsyncConnection[Any], check: EnqueueCheck) -> None:
        cls.seen.append(("async", check.request.idempotency_key))
        cursor = await conn.execute(
            "SELECT 1 FROM opted_out WHERE account = %s", (check.request.subject_account_id,)
        )
        cls._decide(await cursor.fetchone() is not None, check)

    @classmethod
    def _decide(cls, opted_out: bool, check: EnqueueCheck) -> None:
        if opted_out:
            raise Refused(
                "subject_account_id", f"{check.request.subject_account_id} opted out of this"
            )

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class AsyncCheckedAdapter(CheckedAdapter):
    """A check with no sync form."""

    kind = "TEST_ASYNC_CHECKED"
    check_enqueue = ActionAdapter.check_enqueue  # type: ignore[assignment]


@pytest.fixture
def checked(db: OutboxTestDatabase) -> OutboxTestDatabase:
    db.register_kind(CheckedAdapter)
    db.register_kind(AsyncCheckedAdapter)
    db.execute("CREATE TABLE opted_out (account text PRIMARY KEY)")
    db.execute("INSERT INTO opted_out VALUES (%s)", (OPTED_OUT,))
    CheckedAdapter.seen = []
    return db


def request(
    key: str, account: str = "ada", kind: str = "TEST_CHECKED", **fields: Any
) -> ActionRequest:
    return ActionRequest(kind, f"lane:{key}", key, {"n": 1}, subject_account_id=account, **fields)


def count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def test_enqueue_refuses_what_the_kinds_check_refuses_and_writes_nothing(
    checked: OutboxTestDatabase,
) -> None:
    with checked.connect() as conn:
        with pytest.raises(Refused, match="subject_account_id: optout opted out"):
            checked.outbox.enqueue(conn, request("k1", OPTED_OUT))
        assert checked.outbox.enqueue(conn, request("k2")).created
        conn.commit()
    assert checked.rows("SELECT idempotency_key FROM {schema}.agent_action") == [("k2",)]
    assert CheckedAdapter.seen == [("sync", "k1"), ("sync", "k2")]


def test_the_check_sees_the_callers_own_uncommitted_rows(checked: OutboxTestDatabase) -> None:
    with checked.connect() as conn:
        conn.execute("INSERT INTO opted_out VALUES ('bob')")
        with pytest.raises(Refused):
            checked.outbox.enqueue(conn, request("k1", "bob"))


def test_a_batch_with_one_refused_request_writes_none_of_it(checked: OutboxTestDatabase) -> None:
    batch = [request("a"), request("b", OPTED_OUT), request("c")]
    with checked.connect() as conn:
        with pytest.raises(Refused):
            checked.outbox.enqueue_many(conn, batch)
        conn.commit()
    assert count(checked) == 0
    assert CheckedAdapter.seen == [("sync", "a"), ("sync", "b")]


async def test_the_async_paths_run_the_async_check(checked: OutboxTestDatabase) -> None:
    conn = await checked.aconnect()
    async with conn:
        with pytest.raises(Refused):
            await checked.outbox.aenqueue(conn, request("k1", OPTED_OUT))
        with pytest.raises(Refused):
            await checked.outbox.aenqueue_many(conn, [request("a"), request("b", OPTED_OUT)])
        with pytest.raises(Refused):
            await checked.outbox.acheck(conn, [request("c", OPTED_OUT)])
        await checked.outbox.aenqueue(conn, request("k2"))
        await conn.commit()
    assert checked.rows("SELECT idempotency_key FROM {schema}.agent_action") == [("k2",)]
    assert {how for how, _ in CheckedAdapter.seen} == {"async"}


def test_check_runs_every_check_and_writes_nothing(checked: OutboxTestDatabase) -> None:
    with checked.connect() as conn:
        checked.outbox.check(conn, [request("a"), request("b", kind="TEST_NOOP")])
        with pytest.raises(Refused):
            checked.outbox.check(conn, [request("a"), request("b", OPTED_OUT)])
        with pytest.raises(InvalidRequest, match="lane_key"):
            checked.outbox.check(conn, [ActionRequest("TEST_CHECKED", "", "x")])
        conn.commit()
    assert count(checked) == 0


def test_admit_checks_the_proposal_again_and_leaves_a_refused_one_proposed(
    checked: OutboxTestDatabase,
) -> None:
    with checked.connect() as conn:
        kept = checked.outbox.enqueue(conn, request("p1", "bob", proposed=True)).id
        conn.commit()
        checked.execute("INSERT INTO opted_out VALUES ('bob')")  # bob opts out meanwhile
        with pytest.raises(Refused, match="bob opted out"):
            checked.outbox.admit(conn, kept)
        conn.rollback()
    assert checked.scalar("SELECT state FROM {schema}.agent_action") == ActionState.PROPOSED
    checked.execute("DELETE FROM opted_out WHERE account = 'bob'")
    with checked.connect() as conn:
        assert checked.outbox.admit(conn, kept)
        conn.commit()
    assert checked.scalar("SELECT state FROM {schema}.agent_action") == ActionState.ADMITTED
    assert CheckedAdapter.seen == [("sync", "p1")] * 3


def test_a_check_with_only_an_async_form_refuses_sync_callers_with_nothing_written(
    checked: OutboxTestDatabase,
) -> None:
    with checked.connect() as conn:
        with pytest.raises(NeedsAsync, match="only an async form.*aenqueue"):
            checked.outbox.enqueue(conn, request("k1", kind="TEST_ASYNC_CHECKED"))
        with pytest.raises(NeedsAsync):
            checked.outbox.enqueue_many(
                conn, [request("k2"), request("k3", kind="TEST_ASYNC_CHECKED")]
            )
        conn.commit()
    assert count(checked) == 0


def test_a_kind_without_a_check_is_never_called(checked: OutboxTestDatabase) -> None:
    assert not checked.outbox.registry.get("TEST_NOOP").checks_enqueue
    assert checked.outbox.registry.get("TEST_CHECKED").checks_enqueue
    with checked.connect() as conn:
        checked.outbox.enqueue_many(conn, [request("a", OPTED_OUT, kind="TEST_NOOP")])
        conn.commit()
    assert count(checked) == 1 and CheckedAdapter.seen == []


def test_a_check_with_only_a_sync_form_is_refused_at_registration() -> None:
    class SyncOnly(CheckedAdapter):
        kind = "TEST_SYNC_ONLY"
        acheck_enqueue = ActionAdapter.acheck_enqueue  # type: ignore[assignment]

    class CoroutineSync(CheckedAdapter):
        kind = "TEST_COROUTINE_SYNC"

        @classmethod
        async def check_enqueue(cls, conn: Any, check: EnqueueCheck) -> None:  # type: ignore[override]
            return None

    with pytest.raises(RegistrationError, match="overrides check_enqueue but not acheck_enqueue"):
        KindRegistry().register(SyncOnly)
    with pytest.raises(RegistrationError, match="check_enqueue must be a plain method"):
        KindRegistry().register(CoroutineSync)
