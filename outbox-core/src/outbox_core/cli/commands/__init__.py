"""The commands of `outbox`, one module per audience. Each module here is imported when the
group is, and its :func:`..group.command` functions join the group: a new command is a new
module, and no other file changes."""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
