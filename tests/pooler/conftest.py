"""One PgBouncer per pool mode for the module, in front of the tests' server; a fresh database
per test (through either PgBouncer by its name) with the ORM tests' confirmation kind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outbox_core import KindRegistry
from outbox_core.testing import OutboxTestDatabase

from ..integrations.kinds import ConfirmAdapter
from .bouncer import Bouncer, pgbouncer


@pytest.fixture(scope="module")
def transaction_pooler(outbox_server: str) -> Iterator[Bouncer]:
    with pgbouncer(outbox_server, "transaction") as bouncer:
        yield bouncer


# In session mode each client connection holds a server connection while it is open: an
# executor holds OUTBOX_POOL_SIZE (4) + 1 for its LISTEN (its start-up check's two are given
# back before its pool opens). With fewer, its LISTEN connection waits for a free one.
EXECUTOR_SESSIONS = 4 + 1


@pytest.fixture(scope="module")
def session_pooler(outbox_server: str) -> Iterator[Bouncer]:
    with pgbouncer(outbox_server, "session", pool_size=EXECUTOR_SESSIONS) as bouncer:
        yield bouncer


@pytest.fixture
def db(outbox_db: OutboxTestDatabase) -> OutboxTestDatabase:
    outbox_db.registry = KindRegistry()
    outbox_db.register_kind(ConfirmAdapter)
    ConfirmAdapter.ran = []
    return outbox_db


@pytest.fixture
def pooled_url(db: OutboxTestDatabase, transaction_pooler: Bouncer) -> str:
    """The test's database through PgBouncer in transaction mode."""
    return transaction_pooler.url(db.url)
