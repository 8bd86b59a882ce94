"""A notice written once, with a sync ``prepare`` that reads the caller's transaction through
``context.connection`` (the README's notice), serves both enqueue paths (issue 31 item 7): a
sync enqueue hands it the ``Connection``, an async one a sync view of the ``AsyncConnection``,
and both see the rows the transaction has not committed yet."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from outbox_core import ActionRequest, ActionState, Enqueued, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_email import EmailNotice, Mail, NoRecipient, NoticeContext, aenqueue_email
from outbox_email.sync_view import SyncView
from outbox_email.testing import SmtpTestServer

from . import notices
from .conftest import action


@pytest.fixture
def accounts(email_db: OutboxTestDatabase) -> OutboxTestDatabase:
    """The application's own table, read by the notice ``account_welcome`` (a sync prepare)."""
    notices.DATABASE["url"] = email_db.url
    email_db.execute("CREATE TABLE app_account (id int PRIMARY KEY, email text, opted_out bool)")
    return email_db


Enqueue = Callable[[AsyncConnection[Any], OutboxTestDatabase, int], Awaitable[Enqueued]]


async def _with_aenqueue_email(
    conn: AsyncConnection[Any], db: OutboxTestDatabase, account: int
) -> Enqueued:
    return await aenqueue_email(
        conn,
        "account_welcome",
        {"account_id": account},
        idempotency_key=f"account:{account}:welcome",
        outbox=db.outbox,
    )


async def _with_the_cores_aenqueue(
    conn: AsyncConnection[Any], db: OutboxTestDatabase, account: int
) -> Enqueued:
    request = ActionRequest(
        kind="EMAIL",
        lane_key=f"account:{account}",
        idempotency_key=f"account:{account}:welcome",
        payload={"notice": "account_welcome", "event": {"account_id": account}},
    )
    return await db.outbox.aenqueue(conn, request)


PATHS = pytest.mark.parametrize(
    "enqueue", [_with_aenqueue_email, _with_the_cores_aenqueue], ids=["aenqueue_email", "aenqueue"]
)


@PATHS
async def test_a_sync_prepare_reads_the_callers_transaction_from_an_async_enqueue(
    accounts: OutboxTestDatabase, smtp_server: SmtpTestServer, enqueue: Enqueue
) -> None:
    conn = await accounts.aconnect()
    async with conn:  # the application's transaction: the account is not committed yet
        await conn.execute("INSERT INTO app_account VALUES (7, 'new@example.test', false)")
        await enqueue(conn, accounts, 7)
    await accounts.adrain()

    assert ("account_welcome", "enqueue") in notices.PREPARED
    assert action(accounts, "account:7:welcome") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert [m.rcpt_tos for m in smtp_server.messages] == [("new@example.test",)]


@PATHS
async def test_a_sync_prepare_refuses_from_an_async_enqueue_as_from_a_sync_one(
    accounts: OutboxTestDatabase, enqueue: Enqueue
) -> None:
    conn = await accounts.aconnect()
    async with conn:
        await conn.execute("INSERT INTO app_account VALUES (8, 'gone@example.test', true)")
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED"):
            await enqueue(conn, accounts, 8)
        with pytest.raises(NoRecipient, match="NO_RECIPIENT"):
            await enqueue(conn, accounts, 9)  # no such account, not even uncommitted
        await conn.rollback()
    assert accounts.scalar("SELECT count(*) FROM {schema}.agent_action") == 0


async def test_the_sync_view_answers_as_a_connection_does(db_url: str) -> None:
    """What a sync ``prepare`` may call: cursors (with a row factory), iteration, fetches,
    ``transaction()``, attributes; each runs on the caller's connection and transaction."""
    conn = await AsyncConnection.connect(db_url)
    async with conn:
        await conn.execute("CREATE TEMP TABLE seen (n int)")
        await conn.execute("INSERT INTO seen VALUES (1), (2), (3)")
        sync = SyncView(conn, asyncio.get_running_loop())

        def prepare() -> dict[str, Any]:
            with sync.cursor(row_factory=dict_row) as cursor:
                cursor.execute("SELECT n FROM seen ORDER BY n")
                first = cursor.fetchone()
                rest = list(cursor)
            with sync.transaction():
                sync.execute("INSERT INTO seen VALUES (4)")
            return {
                "first": first,
                "rest": rest,
                "count": sync.execute("SELECT count(*) FROM seen").fetchall(),
                "status": sync.info.transaction_status.name,
                "thread": threading.current_thread() is not threading.main_thread(),
            }

        seen = await asyncio.to_thread(prepare)
        assert seen == {
            "first": {"n": 1},
            "rest": [{"n": 2}, {"n": 3}],
            "count": [(4,)],
            "status": "INTRANS",  # the caller's transaction, still open
            "thread": True,
        }
        with pytest.raises(RuntimeError, match="event loop's own thread"):
            sync.execute("SELECT 1")


@pytest.fixture
def db_url(outbox_db: OutboxTestDatabase) -> str:
    return outbox_db.url


class AsyncOnlyNotice(EmailNotice[notices.AccountCreated]):
    name = "async_only"
    event = notices.AccountCreated

    async def aprepare(self, event: Any, context: NoticeContext) -> Mail:
        return Mail(to="a@example.test", subject="Hi", text="Hello.")


def test_a_notice_with_only_aprepare_refuses_a_sync_enqueue_with_needs_async(
    outbox_db: OutboxTestDatabase,
) -> None:
    from outbox_core import EnqueueCheck
    from outbox_core.steps import NeedsAsync, run
    from outbox_email.enqueue_check import email_check_steps

    check = EnqueueCheck(
        ActionRequest("EMAIL", "l", "k", {"notice": "async_only", "event": {"account_id": 1}}),
        {"notice": "async_only", "event": {"account_id": 1}},
        notices.AccountCreated(account_id=1),
        outbox_db.schema,
    )
    with outbox_db.connect() as conn, pytest.raises(NeedsAsync, match="await aenqueue_email"):
        run(conn, email_check_steps(AsyncOnlyNotice(), check))
