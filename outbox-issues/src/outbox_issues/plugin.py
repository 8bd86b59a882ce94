"""The outbox plugin of outbox-issues (entry point ``issues`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: httpx is imported when the executor builds an
adapter.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from outbox_core import ActionAdapter, MigrationLine, PersonDataCatalog, hookimpl

from . import hookspecs
from .adapter import ADAPTERS
from .person_data import IssuesPersonData


@hookimpl
def outbox_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    for adapter in ADAPTERS:
        register(adapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("issues", "outbox_issues", "migrations"))


@hookimpl
def outbox_register_person_data(register: Callable[[PersonDataCatalog], None]) -> None:
    register(IssuesPersonData())
