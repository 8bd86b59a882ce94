"""The stored trace contexts that a claim did not return, read in batches (only while a tracer
provider is configured: see :mod:`outbox_core.tracing`). The claim and the settle's chained
claims return each claimed action's stored context with its row (the claim query's last
column), read in the claim's statement; a read here happens only for an action that statement's
snapshot did not see (enqueued while the claim ran: claim_v1 locks its lanes in a later
snapshot than the statement's) or when tracing was turned on after the claim."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..observability import event
from .batcher import Batcher
from .runtime import Runtime

TraceContext = dict[str, Any] | None


class TraceContexts:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.batcher: Batcher[int, TraceContext] = Batcher(self._flush, name="outbox-traces")

    async def read(self, action_id: int) -> TraceContext:
        """The trace context stored at enqueue, None when there is none. A failed read is
        logged and answers None: a trace is never a reason for an attempt not to run."""
        try:
            return await self.batcher.submit(action_id)
        except Exception as exc:
            event("executor.trace_context.failed", level=logging.WARNING, error=repr(exc))
            return None

    async def close(self) -> None:
        await self.batcher.close()

    async def _flush(self, ids: Sequence[int]) -> list[TraceContext]:
        async with self.rt.connection() as conn:
            cursor = await conn.execute(self.rt.queries["trace_contexts"], {"ids": list(ids)})
            found = {row[0]: row[1] for row in await cursor.fetchall()}
        return [found.get(action_id) for action_id in ids]
