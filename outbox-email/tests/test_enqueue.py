"""The notice prepares the message at enqueue time: what cannot be sent is refused then, with a
clear error, and nothing is written."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from psycopg import Connection

from outbox_core import ActionRequest, ActionState, Enqueued, InvalidRequest, StopReason
from outbox_core.steps import Query, Steps, arun, run
from outbox_core.testing import OutboxTestDatabase
from outbox_email import (
    NoRecipient,
    UnknownNotice,
    aenqueue_email,
    email_request,
    enqueue_email,
    enqueue_email_steps,
)
from outbox_email.testing import SmtpTestServer

from . import notices
from .conftest import action, enqueue


def _count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


@pytest.mark.parametrize(
    ("account", "change", "reason"),
    [
        ("ada", lambda p: setattr(p, "subscribed", False), "UNSUBSCRIBED"),
        ("ada", lambda p: setattr(p, "email", None), "NO_ADDRESS"),
        ("nobody", lambda p: None, "NO_RECIPIENT"),
    ],
)
def test_an_email_nobody_can_receive_is_refused_at_enqueue(
    account: str,
    change: object,
    reason: str,
    email_db: OutboxTestDatabase,
    directory: dict[str, notices.Person],
) -> None:
    if account in directory:
        change(directory[account])  # type: ignore[operator]

    with pytest.raises(NoRecipient, match=reason) as refused:
        enqueue(email_db, "k", event={"account_id": account})

    assert refused.value.reason == reason
    assert refused.value.field == "payload.event"
    assert "nothing was enqueued" in str(refused.value)
    assert _count(email_db) == 0


def test_an_unknown_notice_is_refused_and_names_the_registered_ones(
    email_db: OutboxTestDatabase,
) -> None:
    with pytest.raises(UnknownNotice, match="'welcom'.*account_welcome, admin_alert, welcome"):
        enqueue(email_db, "k", notice="welcom")
    assert _count(email_db) == 0


def test_an_event_that_does_not_fit_the_notice_is_refused(email_db: OutboxTestDatabase) -> None:
    with pytest.raises(InvalidRequest, match="payload.event.plan"):
        enqueue(email_db, "k", event={"account_id": "ada", "plan": "platinum"})
    with pytest.raises(InvalidRequest, match="takes a WelcomeEvent, got AdminAlert"):
        enqueue(
            email_db, "k", event=notices.AdminAlert(account_ids=[], severity=notices.Severity.LOW)
        )
    assert _count(email_db) == 0


def test_a_message_the_notice_cannot_build_is_refused(
    email_db: OutboxTestDatabase, directory: dict[str, notices.Person]
) -> None:
    directory["ada"].email = "not an address"

    with pytest.raises(InvalidRequest, match="cannot be sent: to\\[0\\]: not an ASCII address"):
        enqueue(email_db, "k")
    assert _count(email_db) == 0


def test_the_payload_holds_the_notice_and_its_event_not_the_message(
    email_db: OutboxTestDatabase,
) -> None:
    enqueue(
        email_db,
        "welcome:ada",
        event=notices.WelcomeEvent(account_id="ada", plan="pro"),
        subject_account_id="account-ada",
    )

    row = email_db.rows(
        "SELECT payload, lane_key, workspace_id, subject_account_id, max_attempts "
        "FROM {schema}.agent_action"
    )[0]
    assert row == (
        {"notice": "welcome", "event": {"account_id": "ada", "plan": "pro"}},
        "email:welcome:ada",
        None,
        "account-ada",
        8,
    )


def test_the_notice_prepares_at_enqueue_and_again_before_every_attempt(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    smtp_server.reply("rcpt", 451)
    enqueue(email_db, "k")
    email_db.drain()
    email_db.drain()

    assert notices.PREPARED == [
        ("welcome", "enqueue"),
        ("welcome", "attempt"),
        ("welcome", "attempt"),
    ]
    assert action(email_db, "k") == (ActionState.DONE, StopReason.COMPLETED, 2)


def test_a_second_enqueue_with_the_same_key_returns_the_first_action(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    with email_db.connect() as conn:
        first = enqueue_email(
            conn, "welcome", {"account_id": "ada"}, idempotency_key="k", outbox=email_db.outbox
        )
        again = enqueue_email(
            conn, "welcome", {"account_id": "ada"}, idempotency_key="k", outbox=email_db.outbox
        )
    assert first.created and not again.created and again.id == first.id

    email_db.drain()
    assert len(smtp_server.messages) == 1


def test_an_email_exists_exactly_when_the_transaction_commits(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    with email_db.connect() as conn:
        enqueue_email(
            conn, "welcome", {"account_id": "ada"}, idempotency_key="k", outbox=email_db.outbox
        )
        conn.rollback()

    email_db.drain()
    assert _count(email_db) == 0 and smtp_server.messages == []


def test_a_welcome_for_an_account_created_in_the_same_transaction(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    notices.DATABASE["url"] = email_db.url
    with email_db.connect() as conn:
        conn.execute("CREATE TABLE app_account (id int PRIMARY KEY, email text, opted_out bool)")
    with email_db.connect() as conn:  # the application's transaction
        conn.execute("INSERT INTO app_account VALUES (7, 'new@example.test', false)")
        enqueue_email(
            conn,
            "account_welcome",
            {"account_id": 7},
            idempotency_key="account:7:welcome",
            outbox=email_db.outbox,
        )

    email_db.drain()

    assert action(email_db, "account:7:welcome") == (ActionState.DONE, StopReason.COMPLETED, 1)
    assert [m.rcpt_tos for m in smtp_server.messages] == [("new@example.test",)]


def test_email_requests_go_in_one_round_trip_with_enqueue_many(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    requests = [
        email_request(
            "welcome",
            {"account_id": account},
            idempotency_key=f"welcome:{account}",
            outbox=email_db.outbox,
        )
        for account in ("ada", "bob")
    ]
    with email_db.connect() as conn:
        email_db.outbox.enqueue_many(conn, requests)

    email_db.drain()
    assert sorted(m.rcpt_tos[0] for m in smtp_server.messages) == [
        "ada@example.test",
        "bob@example.test",
    ]


async def test_the_async_enqueue_prepares_with_aprepare_in_the_callers_transaction(
    email_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    conn = await email_db.aconnect()
    async with conn:
        await aenqueue_email(
            conn,
            "admin_alert",
            {"account_ids": ["ada", "bob"], "severity": "low"},
            idempotency_key="alert:1",
            outbox=email_db.outbox,
        )
    await email_db.adrain()

    assert action(email_db, "alert:1") == (ActionState.DONE, StopReason.COMPLETED, 1)
    [received] = smtp_server.messages
    assert received.rcpt_tos == ("ada@example.test",)  # bob is not an admin


async def test_the_async_enqueue_refuses_like_the_sync_one(
    email_db: OutboxTestDatabase, directory: dict[str, notices.Person]
) -> None:
    directory["ada"].roles.clear()
    conn = await email_db.aconnect()
    async with conn:
        with pytest.raises(NoRecipient, match="NOT_PERMITTED"):
            await aenqueue_email(
                conn,
                "admin_alert",
                {"account_ids": ["ada"], "severity": "high"},
                idempotency_key="alert:2",
                outbox=email_db.outbox,
            )
    assert _count(email_db) == 0


def _invite_and_email(db: OutboxTestDatabase, invite: int) -> Steps[Enqueued]:
    """An application's own operation, written once: its row, then the email, one transaction."""
    yield Query("INSERT INTO invite (id) VALUES (%(id)s)", {"id": invite})
    return (
        yield from enqueue_email_steps(
            "welcome", {"account_id": "ada"}, idempotency_key=f"invite:{invite}", outbox=db.outbox
        )
    )


async def test_the_email_steps_compose_into_one_operation_for_sync_and_async_code(
    email_db: OutboxTestDatabase,
) -> None:
    email_db.execute("CREATE TABLE invite (id integer PRIMARY KEY)")
    with email_db.connect() as conn:
        run(conn, _invite_and_email(email_db, 1))
        conn.rollback()  # the caller's transaction holds both, or neither
        sync = run(conn, _invite_and_email(email_db, 2))
        conn.commit()
    aconn = await email_db.aconnect()
    async with aconn:
        again = await arun(
            aconn,
            enqueue_email_steps(
                "welcome", {"account_id": "ada"}, idempotency_key="invite:2", outbox=email_db.outbox
            ),
        )
        other = await arun(aconn, _invite_and_email(email_db, 3))
        await aconn.commit()
    assert email_db.rows("SELECT id FROM invite ORDER BY id") == [(2,), (3,)]
    assert (again.id, again.created) == (sync.id, False) and other.created
    assert notices.PREPARED.count(("welcome", "enqueue")) == 4


def _opted_out_request(db: OutboxTestDatabase, key: str) -> ActionRequest:
    return ActionRequest(
        "EMAIL",
        f"account:{key}",
        key,
        {"notice": "welcome", "event": {"account_id": "ada"}},
        subject_account_id="ada",
    )


def _core_enqueue(db: OutboxTestDatabase, conn: Connection[Any], key: str) -> object:
    return db.outbox.enqueue(conn, _opted_out_request(db, key))


def _core_enqueue_many(db: OutboxTestDatabase, conn: Connection[Any], key: str) -> object:
    # One refused email refuses the batch: bob's, which his notice would send, is not written.
    bob = email_request("welcome", {"account_id": "bob"}, idempotency_key="bob", outbox=db.outbox)
    return db.outbox.enqueue_many(conn, [bob, _opted_out_request(db, key)])


def _enqueue_email(db: OutboxTestDatabase, conn: Connection[Any], key: str) -> object:
    return enqueue_email(
        conn, "welcome", {"account_id": "ada"}, idempotency_key=key, outbox=db.outbox
    )


@pytest.mark.parametrize("path", [_core_enqueue, _core_enqueue_many, _enqueue_email])
def test_every_enqueue_path_refuses_an_email_to_an_account_that_opted_out(
    path: Any, email_db: OutboxTestDatabase, directory: dict[str, notices.Person]
) -> None:
    directory["ada"].subscribed = False
    with email_db.connect() as conn:
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED.*nothing was enqueued"):
            path(email_db, conn, "k")
        conn.commit()
    assert _count(email_db) == 0
    assert ("welcome", "enqueue") in notices.PREPARED


async def test_every_async_enqueue_path_refuses_an_email_to_an_account_that_opted_out(
    email_db: OutboxTestDatabase, directory: dict[str, notices.Person]
) -> None:
    directory["ada"].subscribed = False
    conn = await email_db.aconnect()
    async with conn:
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED"):
            await email_db.outbox.aenqueue(conn, _opted_out_request(email_db, "k1"))
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED"):
            await email_db.outbox.aenqueue_many(conn, [_opted_out_request(email_db, "k2")])
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED"):
            await aenqueue_email(
                conn, "welcome", {"account_id": "ada"}, idempotency_key="k3", outbox=email_db.outbox
            )
        await conn.commit()
    assert _count(email_db) == 0


def test_an_email_request_is_prepared_once_when_it_is_enqueued(
    email_db: OutboxTestDatabase,
) -> None:
    request = email_request(
        "welcome", {"account_id": "ada"}, idempotency_key="k", outbox=email_db.outbox
    )
    assert notices.PREPARED == []  # building the request decides nothing yet
    with email_db.connect() as conn:
        email_db.outbox.enqueue_many(conn, [request])
        conn.commit()
    assert notices.PREPARED == [("welcome", "enqueue")]
    assert _count(email_db) == 1


def test_an_admitted_email_proposal_is_prepared_again(
    email_db: OutboxTestDatabase, directory: dict[str, notices.Person]
) -> None:
    proposal = _opted_out_request(email_db, "p")
    with email_db.connect() as conn:
        action_id = email_db.outbox.enqueue(conn, replace(proposal, proposed=True)).id
        conn.commit()
        directory["ada"].subscribed = False
        with pytest.raises(NoRecipient, match="UNSUBSCRIBED"):
            email_db.outbox.admit(conn, action_id)
    assert email_db.scalar("SELECT state FROM {schema}.agent_action") == "PROPOSED"
