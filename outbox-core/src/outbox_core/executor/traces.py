"""The stored trace contexts of the attempts about to run, read in batches (only while a
tracer provider is configured: see :mod:`outbox_core.tracing`). The claim's rows do not carry
them, so that an executor without tracing reads nothing more than before."""

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
