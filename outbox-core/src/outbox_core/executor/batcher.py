"""Group commits: many small writes from concurrent attempts become one statement.

While one batch is being written, the next one gathers; no timer adds latency, so a lone
write goes out at once and a crowd shares a round trip and a commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class Batcher(Generic[Item, Answer]):
    def __init__(
        self,
        flush: Callable[[Sequence[Item]], Awaitable[Sequence[Answer]]],
        *,
        max_batch: int = 1000,
        name: str = "batcher",
    ) -> None:
        self._flush = flush
        self._max = max_batch
        self._name = name
        self._pending: list[tuple[Item, asyncio.Future[Answer]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._outstanding = 0
        self._idle = asyncio.Event()
        self._closed = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def submit(self, item: Item) -> Answer:
        """Queue ``item`` and wait for its answer."""
        return await self.post(item)

    def post(self, item: Item) -> asyncio.Future[Answer]:
        """Queue ``item``; the future holds its answer once its batch was written."""
        if self._closed:
            raise RuntimeError(f"{self._name} is closed")
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._outstanding += 1
        future.add_done_callback(self._answered)
        self._wake.set()
        self.start()
        return future

    def _answered(self, _future: asyncio.Future[Answer]) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            self._idle.set()

    @property
    def outstanding(self) -> int:
        """Items queued or being written."""
        return self._outstanding

    async def idle(self) -> None:
        """Wait until every item posted so far has its answer."""
        while self._outstanding:
            self._idle.clear()
            await self._idle.wait()

    async def close(self) -> None:
        """Write what is pending, then stop."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                answers = await self._flush([item for item, _ in batch])
            except BaseException as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)
