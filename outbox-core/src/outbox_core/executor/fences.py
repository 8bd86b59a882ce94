"""The write fence and the lease transaction: what an attempt asks of the database while it
runs (the :class:`~outbox_core.attempt.AttemptBackend` of every attempt).

Fences of concurrent attempts are batched into one ``begin_write`` statement (see
``batcher.py``); a lease transaction is one pooled connection held under the lease."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection

from ..attempt import FenceAnswer, LeaseLost
from .batcher import Batcher
from .runtime import Runtime


class Fences:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        # A fence's answer (passed, moved on, short of lease), or None while another transaction
        # holds the row.
        self.batcher: Batcher[tuple[int, int], FenceAnswer | None] = Batcher(
            self._flush, parallel=runtime.settings.batches_in_flight, name="outbox-fencer"
        )

    async def close(self) -> None:
        await self.batcher.close()

    async def begin_write(self, action_id: int, epoch: int) -> FenceAnswer:
        pause = 0.02
        while True:
            answer = await self.batcher.submit((action_id, epoch))
            if answer is not None:
                return answer
            # Another transaction holds the row (an erasure that will delete it, most often):
            # ask again, alone, without holding up the other fences; the margin refuses it
            # once too little of the lease is left.
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 1.0)

    async def _flush(self, requests: Sequence[tuple[int, int]]) -> list[FenceAnswer | None]:
        margin = self.rt.settings.fence_margin_seconds
        params = {
            "ids": [action_id for action_id, _ in requests],
            "epochs": [epoch for _, epoch in requests],
            "margin": margin,
        }
        async with self.rt.connection() as conn:
            # Planned for each batch, never prepared: a generic plan does not know the batch
            # size, and it chose to scan every executing action (through the partial index of
            # executing lanes) once for each fence: 120 us a fence with a thousand running.
            cursor = await conn.execute(self.rt.queries["begin_write"], params, prepare=False)
            # id -> (None, False): passed; (seconds of lease left, False): refused for the
            # margin; (seconds left, True): busy, held by another transaction; not returned:
            # refused, the epoch moved on.
            rows = {row[0]: (row[1], row[2]) for row in await cursor.fetchall()}

        def answer(action_id: int) -> FenceAnswer | None:
            found = rows.get(action_id)
            if found is None:
                return "moved"
            left, busy = found
            if left is None:
                return "passed"
            if busy and left >= margin:
                return None
            return "short"

        return [answer(action_id) for action_id, _ in requests]

    @asynccontextmanager
    async def lease_transaction(
        self, action_id: int, epoch: int
    ) -> AsyncIterator[AsyncConnection[Any]]:
        async with self.rt.connection() as conn:
            try:
                async with conn.transaction():
                    cursor = await conn.execute(
                        self.rt.queries["hold_lease"], {"id": action_id, "epoch": epoch}
                    )
                    row = await cursor.fetchone()
                    if row is None:
                        raise LeaseLost(
                            f"action {action_id}: epoch {epoch} no longer holds it, or its lease "
                            "is over; nothing was written"
                        )
                    # The transaction holds the action's row, which a reclaim must wait for, so
                    # it may not outlive the lease, even if this process stalls: the server ends
                    # a statement, and the session of a transaction left idle, once the lease is
                    # over.
                    left = f"{max(int(row[0]), 1)}ms"
                    await conn.execute(
                        "SELECT set_config('statement_timeout', %(left)s, true),"
                        " set_config('idle_in_transaction_session_timeout', %(left)s, true)",
                        {"left": left},
                    )
                    yield conn
            except (
                psycopg.errors.IdleInTransactionSessionTimeout,
                psycopg.errors.QueryCanceled,
            ) as exc:
                raise LeaseLost(
                    f"action {action_id}: its lease ran out inside the transaction, which the "
                    f"server ended ({exc.diag.message_primary}); nothing was written"
                ) from exc
