"""Group commits: many small writes from concurrent attempts become one statement.

While a batch is being written, the next one gathers; no timer adds latency, so a lone
write goes out at once and a crowd shares a round trip and a commit. With ``parallel`` above
one, that many batches may be written at once (on as many connections), so the database works
on one while this process reads the answer of another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")
# An item and what to call with its answer.
Entry = tuple[Item, Callable[[Answer | BaseException], None] | None]


class Batcher(Generic[Item, Answer]):
    def __init__(
        self,
        flush: Callable[[Sequence[Item]], Awaitable[Sequence[Answer]]],
        *,
        max_batch: int = 1000,
        parallel: int = 1,
        name: str = "batcher",
    ) -> None:
        if parallel < 1:
            raise ValueError(f"{name}: parallel must be at least 1, not {parallel}")
        self._flush = flush
        self._max = max_batch
        self._parallel = parallel
        # Batches being written, by their writer task (parallel > 1); a batch is emptied once
        # its items have their answers.
        self._writing: dict[asyncio.Task[None], list[Entry[Item, Answer]]] = {}
        # The batch being written when ``parallel`` is one.
        self._serial: list[Entry[Item, Answer]] = []
        self._name = name
        self._pending: list[Entry[Item, Answer]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._outstanding = 0
        self._idle = asyncio.Event()
        self._delivered = asyncio.Event()
        self._closed = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def submit(self, item: Item) -> Answer:
        """Queue ``item`` and wait for its answer."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

        def settle(answer: Answer | BaseException) -> None:
            if future.done():
                return
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)

        self.post(item, settle)
        return await future

    def post(
        self, item: Item, done: Callable[[Answer | BaseException], None] | None = None
    ) -> None:
        """Queue ``item`` without waiting; ``done`` is called with its answer (or the error
        that failed its batch) right after the batch was written, without a task switch.
        While :meth:`close` still writes, items posted meanwhile are written too."""
        if not self.accepting:
            raise RuntimeError(f"{self._name} is closed")
        self._pending.append((item, done))
        self._outstanding += 1
        self._wake.set()
        self.start()

    def _answered(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            self._idle.set()

    @property
    def accepting(self) -> bool:
        """Whether :meth:`post` takes items: before :meth:`close`, and while it still writes."""
        return not self._closed or (self._task is not None and not self._task.done())

    @property
    def outstanding(self) -> int:
        """Items queued or being written."""
        return self._outstanding

    def holds(self, picks: Callable[[Item], bool]) -> bool:
        """Whether an item that ``picks`` accepts is queued or being written (its ``done``
        not called yet)."""
        batches = [self._pending, self._serial, *self._writing.values()]
        return any(picks(item) for batch in batches for item, _ in batch)

    async def written(self, picks: Callable[[Item], bool]) -> None:
        """Wait until no item that ``picks`` accepts is queued or being written (unlike
        :meth:`idle`, which a steady stream of other items may keep from ever coming)."""
        while self.holds(picks):
            self._delivered.clear()
            await self._delivered.wait()

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
        try:
            await self._gather_and_write()
        finally:
            # Cancelled (the loop is closing): the writes in flight go down with this task and
            # answer their items with the cancellation.
            for writer in list(self._writing):
                writer.cancel()
            if self._writing:
                await asyncio.gather(*self._writing, return_exceptions=True)

    async def _gather_and_write(self) -> None:
        while True:
            if not self._pending or len(self._writing) >= self._parallel:
                if self._closed and not self._pending and not self._writing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            if self._parallel == 1:
                self._serial = batch
                try:
                    await self._write(batch)
                finally:
                    self._serial = []
                continue
            writer = asyncio.create_task(self._write(batch), name=f"{self._name}-write")
            self._writing[writer] = batch
            writer.add_done_callback(self._written)

    def _written(self, writer: asyncio.Task[None]) -> None:
        batch = self._writing.pop(writer)
        if batch:  # cancelled before it began: its items still get an answer
            self._deliver(batch, [asyncio.CancelledError()] * len(batch))
        self._wake.set()

    async def _write(self, batch: list[Entry[Item, Answer]]) -> None:
        try:
            answers: Sequence[Answer | BaseException] = await self._flush(
                [item for item, _ in batch]
            )
        except asyncio.CancelledError as exc:
            self._deliver(batch, [exc] * len(batch))
            raise
        except Exception as exc:
            answers = [exc] * len(batch)
        self._deliver(batch, answers)

    def _deliver(
        self,
        batch: list[Entry[Item, Answer]],
        answers: Sequence[Answer | BaseException],
    ) -> None:
        delivered, batch[:] = list(batch), []
        for (_, done), answer in zip(delivered, answers, strict=True):
            self._answered()
            if done is not None:
                done(answer)
        self._delivered.set()
