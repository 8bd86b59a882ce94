"""The names through which plugins are found and chosen: the entry point group and the
environment variables that block, allow or add plugins. Their own module, with no imports of
the core, so that the settings (which know the plugins' tables) and the plugin host read them
from one place without importing each other."""

from __future__ import annotations

import os

ENTRY_POINT_GROUP = "outbox_core.plugins"
DISABLE_VARIABLE = "OUTBOX_DISABLE_PLUGINS"
ALLOW_VARIABLE = "OUTBOX_PLUGINS"
APP_VARIABLE = "OUTBOX_APP_PLUGINS"


def listed(variable: str) -> list[str] | None:
    """The comma-separated names of an environment variable (None when it is unset)."""
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]
