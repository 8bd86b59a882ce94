"""The outbox plugin of outbox-feedback (entry point ``feedback`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: httpx is imported when the executor builds an
adapter.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox_core import ActionAdapter, MigrationLine, PersonDataCatalog, hookimpl

from .adapter import ADAPTERS
from .person_data import FeedbackPersonData


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    for adapter in ADAPTERS:
        register(adapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("feedback", "outbox_feedback", "migrations"))


@hookimpl
def outbox_register_person_data(register: Callable[[PersonDataCatalog], None]) -> None:
    register(FeedbackPersonData())
