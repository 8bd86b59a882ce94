"""The pytest plugin (entry point ``pytest11: outbox``): fixtures on a real PostgreSQL.

- ``outbox_server``: a maintenance URL for the session (see ``find_server``).
- ``outbox_template``: the name of a database migrated once per session with every installed
  plugin's migration lines.
- ``outbox_db``: a fresh database cloned from the template for one test, as an
  ``OutboxTestDatabase`` (register throwaway kinds with ``outbox_db.register_kind``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..plugins import build_host
from .database import OutboxTestDatabase, build_template, find_server, fresh_database

SCHEMA = "outbox"


@pytest.fixture(scope="session")
def outbox_server() -> Iterator[str]:
    url, handle = find_server()
    try:
        yield url
    finally:
        if handle is not None:
            handle.stop()


@pytest.fixture(scope="session")
def outbox_plugin_host() -> Any:
    return build_host()


@pytest.fixture(scope="session")
def outbox_template(outbox_server: str, outbox_plugin_host: Any) -> str:
    return build_template(outbox_server, outbox_plugin_host.migration_lines, SCHEMA)


@pytest.fixture
def outbox_db(
    outbox_server: str, outbox_template: str, outbox_plugin_host: Any
) -> Iterator[OutboxTestDatabase]:
    with fresh_database(outbox_server, outbox_template) as (url, name):
        yield OutboxTestDatabase(
            url=url,
            name=name,
            schema=SCHEMA,
            host=outbox_plugin_host,
            registry=outbox_plugin_host.registry.copy(),
        )
