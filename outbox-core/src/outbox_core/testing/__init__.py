"""The harness that outbox's own packages, plugin authors and applications test with.

- :func:`drain` / :func:`adrain`: make every waiting action due and run the executor until no
  action is due (the specification's ``ActionTestSupport.drain``).
- The pytest plugin (``outbox_core.testing.plugin``, loaded by the ``pytest11`` entry point):
  a session-wide PostgreSQL, a template database migrated once per session, and a fresh
  database per test (fixture ``outbox_db``) where throwaway kinds can be registered.
- :mod:`outbox_core.testing.conformance`: the adapter conformance suite, a pytest class
  (``AdapterConformance``) that a plugin subclasses with one fixture, its target (imported on
  its own: it needs pytest).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..executor import Executor
from ..outbox import Outbox
from .database import OutboxTestDatabase, find_server

__all__ = ["OutboxTestDatabase", "adrain", "drain", "find_server"]


async def adrain(outbox: Outbox, conninfo: str, *, timeout: float = 60.0, **settings: Any) -> int:
    """Async :func:`drain`. ``settings`` override the executor's (e.g. ``lease_seconds``)."""
    merged = outbox.settings.model_copy(update=settings) if settings else outbox.settings
    async with Executor(outbox, conninfo, settings=merged) as executor:
        return await executor.drain(timeout=timeout)


def drain(outbox: Outbox, conninfo: str, *, timeout: float = 60.0, **settings: Any) -> int:
    """Make every waiting action due and run the executor until no action is due. Returns how
    many attempts and endings ran. From async code, await :func:`adrain` instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrain(outbox, conninfo, timeout=timeout, **settings))
    raise RuntimeError("drain() was called inside a running event loop; use `await adrain(...)`")
