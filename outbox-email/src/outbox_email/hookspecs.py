"""The hook outbox-email adds. This module is the manual.

The plugin adds these specifications in ``outbox_add_hookspecs``, so any plugin, or the
application registered as one (an entry point in ``outbox_core.plugins``, or
a module named in ``OUTBOX_APP_PLUGINS``), can implement them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from outbox_core import hookspec

if TYPE_CHECKING:
    from .notices import EmailNotice


@hookspec
def outbox_register_email_notices(register: Callable[[EmailNotice[Any]], None]) -> None:
    """Register your email notices: ``register(PasswordChanged())``, an instance each.

    Called once per plugin load, while the ``EMAIL`` kind is registered: the notices' event
    models become the kind's variants (tagged by notice name), so a replica only claims the
    emails of notices it knows. A notice name that another plugin already registered raises
    ``RegistrationError`` naming both; so does a notice without a valid ``name``, an ``event``
    that is not a pydantic model, or no ``prepare``. Register notices only here: the variants
    are fixed once the plugins are loaded."""
