"""outbox_core.integrations.django: the action commits and rolls back with the atomic block,
and is refused outside one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import django
import pytest
from django.conf import settings
from django.db import connections, transaction
from psycopg.conninfo import conninfo_to_dict

from outbox_core import ActionRequest
from outbox_core.integrations import NotInTransaction
from outbox_core.integrations.django import enqueue
from outbox_core.testing import OutboxTestDatabase

from .conftest import action_count, order_count
from .kinds import ConfirmAdapter, Confirmation

if not settings.configured:
    settings.configure(DATABASES={}, INSTALLED_APPS=[], USE_TZ=True)
    django.setup()


@pytest.fixture
def using(db: OutboxTestDatabase) -> Iterator[str]:
    """A Django database alias of its own for this test's fresh database (the ORM's setting is
    the process's, the database the test's)."""
    params = conninfo_to_dict(db.url)
    alias = f"test_{uuid.uuid4().hex[:8]}"
    with django_database(
        alias,
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": params["dbname"],
            "USER": params.get("user") or "postgres",
            "PASSWORD": params.get("password") or "",
            "HOST": params.get("host") or "127.0.0.1",
            "PORT": params.get("port") or "5432",
        },
    ):
        yield alias


@contextmanager
def django_database(alias: str, database: dict[str, Any]) -> Iterator[None]:
    """``alias`` in Django's DATABASES while the block runs."""
    # configure_settings fills in Django's defaults (and wants a "default" entry to do it).
    connections.settings[alias] = connections.configure_settings({"default": database})["default"]
    try:
        yield
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


def confirm(order_id: int) -> ActionRequest:
    return ActionRequest(
        "TEST_CONFIRM", f"order:{order_id}", f"confirm:{order_id}", Confirmation(order_id=order_id)
    )


def add_order(using: str, order_id: int) -> None:
    with connections[using].cursor() as cursor:
        cursor.execute("INSERT INTO public.orders VALUES (%s, 'tea')", [order_id])


def test_an_action_enqueued_in_a_committed_atomic_block_runs(
    db: OutboxTestDatabase, using: str
) -> None:
    with transaction.atomic(using=using):
        add_order(using, 1)
        enqueued = enqueue(confirm(1), using=using, outbox=db.outbox)
    assert enqueued.created
    db.drain()
    assert ConfirmAdapter.ran == [enqueued.id]
    assert order_count(db) == 1


class Undo(Exception):
    pass


def test_a_rolled_back_atomic_block_leaves_no_action(db: OutboxTestDatabase, using: str) -> None:
    with suppress(Undo), transaction.atomic(using=using):
        add_order(using, 1)
        enqueue(confirm(1), using=using, outbox=db.outbox)
        raise Undo
    assert action_count(db) == 0
    assert order_count(db) == 0


def test_a_rolled_back_nested_block_leaves_no_action_and_the_rest_commits(
    db: OutboxTestDatabase, using: str
) -> None:
    with transaction.atomic(using=using):
        add_order(using, 1)
        with suppress(Undo), transaction.atomic(using=using):
            enqueue(confirm(1), using=using, outbox=db.outbox)
            raise Undo
    assert action_count(db) == 0
    assert order_count(db) == 1


def test_a_second_enqueue_of_the_same_key_returns_the_first_action(
    db: OutboxTestDatabase, using: str
) -> None:
    with transaction.atomic(using=using):
        first = enqueue(confirm(1), using=using, outbox=db.outbox)
    with transaction.atomic(using=using):
        second = enqueue(confirm(1), using=using, outbox=db.outbox)
    assert first.created and not second.created
    assert second.id == first.id
    assert action_count(db) == 1


def test_an_enqueue_outside_an_atomic_block_is_refused_and_writes_nothing(
    db: OutboxTestDatabase, using: str
) -> None:
    with pytest.raises(NotInTransaction, match=r"transaction\.atomic"):
        enqueue(confirm(1), using=using, outbox=db.outbox)
    assert action_count(db) == 0


def test_an_atomic_block_on_another_alias_does_not_count(
    db: OutboxTestDatabase, using: str
) -> None:
    other = f"{using}_other"
    with (
        django_database(other, dict(connections.settings[using])),
        transaction.atomic(using=other),
        pytest.raises(NotInTransaction, match=using),
    ):
        enqueue(confirm(1), using=using, outbox=db.outbox)
    assert action_count(db) == 0
