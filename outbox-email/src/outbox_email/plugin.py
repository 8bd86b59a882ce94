"""The outbox plugin of outbox-email (entry point ``email`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: aiosmtplib is imported when the executor builds
the adapter.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from outbox_core import ActionAdapter, MigrationLine, RegistrationContext, hookimpl

from . import hookspecs
from .adapter import EmailAdapter
from .notices import collect_notices


@hookimpl
def outbox_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def outbox_register_kinds(
    register: Callable[[type[ActionAdapter]], None], context: RegistrationContext
) -> None:
    # Every plugin's hookspecs are in by now: the notices of this host's plugins (and of the
    # application) become the EMAIL kind's variants, and stay in this plugin's state.
    notices = collect_notices(context.pluginmanager)
    context.state["notices"] = notices
    register(EmailAdapter.bind(notices))


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("email", "outbox_email", "migrations"))
