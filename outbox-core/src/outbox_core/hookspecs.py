"""The hooks a plugin implements. This module is the manual.

A plugin is a distribution with an entry point in the group ``outbox_core.plugins`` whose
name is the distribution's name without ``outbox-`` (``email = "outbox_email.plugin"``). The
module it names holds ``@hookimpl`` functions only and is cheap to import: provider SDKs are
imported where adapters are built.

Every registering hook receives a ``register`` callback; the host validates each
registration and names both sides of a conflict. Hooks are called once per
``load_plugins()``, in plugin registration order (the core's own hooks first).

Every hook may also take ``context``, a :class:`RegistrationContext`: the plugin manager of the
host being built (to call the hooks of your own hookspecs from ``outbox_register_kinds``, say)
and ``context.state``, this plugin's own place in that host, for what your hooks collect (the
results of your own hookspecs) and what a later hook or your package reads back from
``host.plugin_state[name]``. No plugin needs module globals or thread-locals to pass anything
between its hooks. A hook implementation takes only the arguments it names: one written
before ``context`` existed (``register`` only) keeps working.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .adapter import ActionAdapter
    from .migrations import MigrationLine
    from .person_data import PersonDataCatalog

PROJECT = "outbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class RegistrationContext:
    """What the host hands a hook that names ``context``: who is being called, in which
    host, and that plugin's own state in it."""

    plugin: str
    """The plugin's name (its entry point's name, or the module's for ``OUTBOX_APP_PLUGINS``)."""
    distribution: str
    version: str
    pluginmanager: pluggy.PluginManager
    """The plugin manager of the host being built: ``context.hook.<your hook>`` calls the
    implementations of your own hookspecs (added in ``outbox_add_hookspecs``)."""
    state: dict[str, Any]
    """This plugin's own place in the host (``host.plugin_state[plugin]``): one dict per plugin
    and host, shared by its hooks, empty before the first one. Keep what your hooks collect
    here, not in module globals, so that two hosts never see each other's."""

    @property
    def hook(self) -> Any:
        return self.pluginmanager.hook


@hookspec
def outbox_add_hookspecs(pluginmanager: pluggy.PluginManager, context: RegistrationContext) -> None:
    """Called first, before any other hook: add the hookspecs of your own package (for
    example ``outbox_register_email_notices``) with ``pluginmanager.add_hookspecs(module)``, so
    that other plugins and the application can implement them."""


@hookspec
def outbox_register_kinds(
    register: Callable[[type[ActionAdapter]], None], context: RegistrationContext
) -> None:
    """Register the adapter classes of your kinds: ``register(SlackPostAdapter)``.

    Called after every plugin's ``outbox_add_hookspecs``: a kind whose variants come from your
    own hookspecs collects them here through ``context.hook`` (outbox-email's notices), and may
    keep what it collected in ``context.state``.

    Each class names its kind, its flags and ``variants()``. A kind that another distribution
    already registered raises ``RegistrationError`` naming both; so does a class without
    ``variants()``. Every registered kind must also be inserted into the kind registry table by
    one of your migration lines."""


@hookspec
def outbox_register_migrations(
    register: Callable[[MigrationLine], None], context: RegistrationContext
) -> None:
    """Register your migration line: ``register(MigrationLine("email", "outbox_email",
    "migrations"))``, a folder of numbered ``NNNN_name.sql`` files inside your package.

    Lines are applied after ``core``, in name order; a second line with the same name raises.
    Migrations are additive: replicas of two builds share the database during a rollout."""


@hookspec
def outbox_register_person_data(
    register: Callable[[PersonDataCatalog], None], context: RegistrationContext
) -> None:
    """Register what your package erases when a person is erased: an object with
    ``name`` and ``async erase(conn, subject_account_id) -> int``, run in the erasure's
    transaction after the subject's actions are deleted. A catalog that cancels or enqueues
    actions there gets the erasure's Outbox from ``outbox_core.erasure.erasing_outbox()``."""
