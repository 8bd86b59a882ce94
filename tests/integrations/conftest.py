"""A fresh database per test with the confirmation kind and an application table of its own."""

from __future__ import annotations

import pytest

from outbox_core import KindRegistry
from outbox_core.testing import OutboxTestDatabase

from .kinds import ConfirmAdapter


@pytest.fixture
def db(outbox_db: OutboxTestDatabase) -> OutboxTestDatabase:
    outbox_db.registry = KindRegistry()
    outbox_db.register_kind(ConfirmAdapter)
    ConfirmAdapter.ran = []
    outbox_db.execute("CREATE TABLE public.orders (id integer PRIMARY KEY, item text NOT NULL)")
    return outbox_db


def action_count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {schema}.agent_action"))


def order_count(db: OutboxTestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM public.orders"))
