"""The outbox plugin of outbox-email (entry point ``email`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: aiosmtplib is imported when the executor builds
the adapter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pluggy

from outbox_core import ActionAdapter, MigrationLine, RegistrationError, hookimpl

from . import hookspecs
from .adapter import EmailAdapter
from .notices import collect_notices

# The plugin manager of the host being built, between outbox_add_hookspecs and
# outbox_register_kinds (both run in one build_host() call, on one thread).
_building = threading.local()


@hookimpl
def outbox_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)
    _building.pluginmanager = pluginmanager


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    pluginmanager = _building.__dict__.pop("pluginmanager", None)
    if pluginmanager is None:
        raise RegistrationError(
            "outbox-email: outbox_register_kinds ran without outbox_add_hookspecs; load the "
            "plugin through outbox_core.plugins.build_host()"
        )
    register(EmailAdapter.bind(collect_notices(pluginmanager)))


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("email", "outbox_email", "migrations"))
