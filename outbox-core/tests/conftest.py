from __future__ import annotations

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
    ScriptedAdapter.calls = []
    ScriptedAdapter.endings = []
    AtMostOnceAdapter.calls = []
    AtMostOnceAdapter.endings = []
    return outbox_db
