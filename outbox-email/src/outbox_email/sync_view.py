"""A sync face of the caller's ``AsyncConnection``, for a notice's sync ``prepare`` when an async
enqueue (``aenqueue``, ``aenqueue_email``, ``aenqueue_many``, ``aadmit``) calls it.

``prepare`` runs in a worker thread while the event loop awaits it; what it calls on the view
(``execute``, ``cursor()``, ``fetchone``, iteration, ``transaction()``, ...) is the same call on
the async connection, run on that loop, and the view hands back the answer (a cursor as
another view, a row as it is). So ``prepare`` reads the caller's transaction, uncommitted rows
included, as it would through a ``psycopg.Connection``, and one notice serves both paths.
SQLAlchemy's asyncio layer adapts async drivers to its sync API the same way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any


class SyncView:
    """The sync form of an async psycopg object (a connection, a cursor, a transaction), for
    code that runs in a worker thread of ``loop`` while the loop awaits it."""

    __slots__ = ("_loop", "_target")

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def _answer(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                # The loop would wait for itself: this view serves the worker thread only.
                if inspect.iscoroutine(value):
                    value.close()
                raise RuntimeError(
                    "the sync view of an AsyncConnection was used on its event loop's own "
                    "thread; use the AsyncConnection there (with await), or call prepare() "
                    "through aprepare(), which runs it in a worker thread"
                )
            value = asyncio.run_coroutine_threadsafe(_awaited(value), self._loop).result()
        return view(value, self._loop)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if callable(value) and not isinstance(value, type):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._answer(value(*args, **kwargs))

            return call
        return value

    def __enter__(self) -> Any:
        return self._answer(self._target.__aenter__())

    def __exit__(self, *exc: Any) -> Any:
        return self._answer(self._target.__aexit__(*exc))

    def __iter__(self) -> Iterator[Any]:
        iterator = self._target.__aiter__()
        while True:
            try:
                yield self._answer(iterator.__anext__())
            except StopAsyncIteration:
                return

    def __repr__(self) -> str:
        return f"<sync view of {self._target!r}>"


def view(value: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """``value`` as the sync code sees it: an async object (one that is entered or iterated
    with ``async``) as a :class:`SyncView`, anything else (a row, a count) as it is."""
    kind = type(value)
    if hasattr(kind, "__aenter__") or hasattr(kind, "__aiter__"):
        return SyncView(value, loop)
    return value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
