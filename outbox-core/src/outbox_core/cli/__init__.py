"""The `outbox` command (entry point ``outbox_core.cli:main``): the group and its shared
options in :mod:`.group`, one-line errors in :mod:`.guard`, how a command reaches its database
in :mod:`.database`, the commands in :mod:`.commands`, one module per audience."""

from __future__ import annotations

from . import commands as commands
from .group import main
from .guard import MISSING_OBJECT, _guard

__all__ = ["MISSING_OBJECT", "_guard", "main"]
