"""The hooks a plugin implements. This module is the manual.

A plugin is a distribution with an entry point in the group ``outbox_core.plugins`` whose
name is the distribution's name without ``outbox-`` (``email = "outbox_email.plugin"``). The
module it names holds ``@hookimpl`` functions only and is cheap to import: provider SDKs are
imported where adapters are built.

Every registering hook receives a ``register`` callback; the host validates each
registration and names both sides of a conflict. Hooks are called once per
``load_plugins()``, in plugin registration order (the core's own hooks first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .adapter import ActionAdapter
    from .erasure import PersonDataCatalog
    from .migrations import MigrationLine

PROJECT = "outbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def outbox_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    """Called first, before any other hook: add the hookspecs of your own package (for
    example ``outbox_register_email_notices``) with ``pluginmanager.add_hookspecs(module)``, so
    that other plugins and the application can implement them."""


@hookspec
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    """Register the adapter classes of your kinds: ``register(SlackPostAdapter)``.

    Each class names its kind, its flags and ``variants()``. A kind that another distribution
    already registered raises ``RegistrationError`` naming both; so does a class without
    ``variants()``. Every registered kind must also be inserted into the kind registry table by
    one of your migration lines."""


@hookspec
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    """Register your migration line: ``register(MigrationLine("email", "outbox_email",
    "migrations"))``, a folder of numbered ``NNNN_name.sql`` files inside your package.

    Lines are applied after ``core``, in name order; a second line with the same name raises.
    Migrations are additive: replicas of two builds share the database during a rollout."""


@hookspec
def outbox_register_person_data(register: Callable[[PersonDataCatalog], None]) -> None:
    """Register what your package erases when a person is erased: an object with
    ``name`` and ``async erase(conn, subject_account_id) -> int``, run in the erasure's
    transaction after the subject's actions are deleted. A catalog that cancels or enqueues
    actions there gets the erasure's Outbox from ``outbox_core.erasure.erasing_outbox()``."""
