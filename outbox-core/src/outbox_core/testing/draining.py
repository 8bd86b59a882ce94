"""``drain``: run the executor until no action is due (the specification's
``ActionTestSupport.drain``). Its own module, below ``database``, which uses it."""

from __future__ import annotations

import asyncio
from typing import Any

from ..executor import Executor
from ..outbox import Outbox


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
