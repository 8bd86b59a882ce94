"""The outbox plugin of outbox-slack (entry point ``slack`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: slack_sdk and aiohttp are imported when the
executor builds the adapter, so ``outbox migrate`` never imports them.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox_core import ActionAdapter, MigrationLine, PersonDataCatalog, hookimpl

from .adapter import SlackPostAdapter
from .domain import SlackPersonData


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(SlackPostAdapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("slack", "outbox_slack", "migrations"))


@hookimpl
def outbox_register_person_data(register: Callable[[PersonDataCatalog], None]) -> None:
    register(SlackPersonData())
