"""Cross-package suites: real PostgreSQL through the outbox_core pytest plugin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from outbox_core.testing.database import find_server, with_database


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database with nothing in it (no outbox schema) on the test server, dropped after."""
    admin_url, _ = find_server()
    name = f"outbox_doc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
