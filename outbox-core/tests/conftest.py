from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from outbox_core import KindRegistry
from outbox_core.testing import OutboxTestDatabase

from .kinds import (
    AtMostOnceAdapter,
    FencedAdapter,
    NoopAdapter,
    ScriptedAdapter,
    WorkspaceAdapter,
)


@pytest.fixture
def db(outbox_db: OutboxTestDatabase) -> OutboxTestDatabase:
    """A fresh database with the core's test kinds registered, and only those: the kinds of
    other installed plugins are theirs to test."""
    outbox_db.registry = KindRegistry()
    for adapter in (
        NoopAdapter,
        FencedAdapter,
        ScriptedAdapter,
        AtMostOnceAdapter,
        WorkspaceAdapter,
    ):
        outbox_db.register_kind(adapter)
    ScriptedAdapter.script = None
    # A test may set a script on the subclass itself: each test starts with it inherited again.
    if "script" in vars(AtMostOnceAdapter):
        del AtMostOnceAdapter.script
    ScriptedAdapter.calls = []
    ScriptedAdapter.endings = []
    AtMostOnceAdapter.calls = []
    AtMostOnceAdapter.endings = []
    return outbox_db


@pytest.fixture
def unmigrated_url(outbox_server: str) -> Iterator[str]:
    """A fresh, empty database on the harness's server (no outbox schema), dropped after."""
    from outbox_core.testing.database import with_database

    name = f"outbox_unmigrated_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(outbox_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(outbox_server, name)
    finally:
        with psycopg.connect(outbox_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
