"""The group-commit batcher: batches gather while others are written, answers reach their
items, a failed batch fails only its own items, and close() writes what is pending."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import pytest

from outbox_core.executor.batcher import Batcher
from outbox_core.settings import OutboxSettings

T = TypeVar("T")


class Gate:
    """A flush that records its batches and waits until the test lets each one finish."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.writing = 0
        self.most_at_once = 0
        self.release = asyncio.Event()

    async def flush(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        self.writing += 1
        self.most_at_once = max(self.most_at_once, self.writing)
        try:
            await self.release.wait()
        finally:
            self.writing -= 1
        if 13 in items:
            raise RuntimeError("batch with 13 failed")
        return [item * 10 for item in items]


async def settle_a_moment() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def within(awaitable: Awaitable[T]) -> T:
    """A broken batcher hangs its callers: fail instead."""
    return await asyncio.wait_for(awaitable, 30)


async def test_two_batches_are_written_at_once_and_the_rest_gathers_behind_them() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate.flush, parallel=2, name="test")
    answers = [asyncio.ensure_future(batcher.submit(1))]
    await settle_a_moment()
    answers.append(asyncio.ensure_future(batcher.submit(2)))
    await settle_a_moment()
    answers += [asyncio.ensure_future(batcher.submit(n)) for n in (3, 4, 5)]
    await settle_a_moment()
    # Two writes in flight ([1] and [2]); 3, 4 and 5 wait together for a free place.
    assert gate.batches == [[1], [2]]
    assert batcher.outstanding == 5
    gate.release.set()
    assert await within(asyncio.gather(*answers)) == [10, 20, 30, 40, 50]
    assert gate.batches == [[1], [2], [3, 4, 5]]
    assert gate.most_at_once == 2
    assert batcher.outstanding == 0
    await within(batcher.close())


async def test_one_at_a_time_unless_asked() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate.flush, name="test")
    first = asyncio.ensure_future(batcher.submit(1))
    await settle_a_moment()
    rest = [asyncio.ensure_future(batcher.submit(n)) for n in (2, 3)]
    await settle_a_moment()
    assert gate.batches == [[1]]
    gate.release.set()
    assert await within(asyncio.gather(first, *rest)) == [10, 20, 30]
    assert gate.batches == [[1], [2, 3]] and gate.most_at_once == 1
    await within(batcher.close())


async def test_a_failed_batch_fails_only_its_own_items() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate.flush, parallel=2, name="test")
    bad = asyncio.ensure_future(batcher.submit(13))
    await settle_a_moment()
    good = asyncio.ensure_future(batcher.submit(7))
    await settle_a_moment()
    assert gate.writing == 2  # both batches in flight when the first one fails
    gate.release.set()
    with pytest.raises(RuntimeError, match="batch with 13 failed"):
        await within(bad)
    assert await within(good) == 70
    assert batcher.outstanding == 0
    await within(batcher.close())


async def test_a_cancelled_batcher_answers_every_item_in_flight() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate.flush, parallel=2, name="test")
    seen: list[int | BaseException] = []
    for n in (1, 2, 3):
        batcher.post(n, seen.append)
        await settle_a_moment()
    assert gate.writing == 2 and batcher.outstanding == 3
    assert batcher._task is not None
    batcher._task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(batcher._task)
    # The two writes in flight answer with the cancellation; the third item was never taken.
    assert [type(answer) for answer in seen] == [asyncio.CancelledError] * 2
    assert batcher.outstanding == 1


async def test_close_writes_what_is_pending_and_refuses_more() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate.flush, parallel=2, name="test")
    seen: list[int | BaseException] = []
    for n in range(1, 6):
        batcher.post(n, seen.append)
    closing = asyncio.ensure_future(batcher.close())
    await settle_a_moment()
    assert not closing.done()
    gate.release.set()
    await within(closing)
    assert sorted(seen) == [10, 20, 30, 40, 50]  # type: ignore[type-var]
    with pytest.raises(RuntimeError, match="test is closed"):
        batcher.post(6)


def test_parallel_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="test: parallel must be at least 1, not 0"):
        Batcher(Gate().flush, parallel=0, name="test")


@pytest.mark.parametrize(
    ("pool_size", "in_flight"), [(2, 1), (3, 1), (4, 2), (5, 3), (6, 3), (20, 3)]
)
def test_an_executor_writes_as_many_batches_at_once_as_its_pool_leaves_room_for(
    pool_size: int, in_flight: int
) -> None:
    # Two connections stay with the claim loop, the maintenance and the lease transactions;
    # more than three batches at once would cut them smaller than they pay for.
    assert OutboxSettings(pool_size=pool_size).batches_in_flight == in_flight
