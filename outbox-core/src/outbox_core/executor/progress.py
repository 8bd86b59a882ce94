"""The busy executor's line a minute: ``executor.progress`` with what it did since the last
one (actions claimed, ended by state, made to wait again) and how many attempts are in flight.
An idle executor says nothing: a minute without a claim, an ending or an attempt running logs
no line. The counts are this executor's, kept in memory (two integers per action); the
metrics (``action.claimed``, ``action.ended``) hold the same facts for a dashboard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..observability import event
from ..states import ActionState

# The fields of the line, in order: each ended state's count under its lower-case name.
_ENDED = (ActionState.DONE, ActionState.FAILED, ActionState.CANCELLED, ActionState.UNCERTAIN)


class Progress:
    """Counts since the last progress line, and the loop that logs them."""

    def __init__(self) -> None:
        self.claimed = 0
        self.rescheduled = 0
        self.ended: dict[ActionState, int] = {}

    def count_ended(self, state: ActionState) -> None:
        if state.ended:
            self.ended[state] = self.ended.get(state, 0) + 1
        else:
            self.rescheduled += 1

    def counts(self) -> dict[str, int]:
        """The counts since the last line, under the line's names: ``claimed``, each ended
        state's (``done``, ``failed``, ``cancelled``, ``uncertain``), ``rescheduled``."""
        return {
            "claimed": self.claimed,
            **{state.value.lower(): self.ended.get(state, 0) for state in _ENDED},
            "rescheduled": self.rescheduled,
        }

    def report(self, seconds: float, in_flight: int) -> bool:
        """Log the line and start counting afresh; nothing (False) when there is nothing to
        say: no claim, no ending and no attempt in flight since the last line."""
        counts = self.counts()
        if not (any(counts.values()) or in_flight):
            return False
        self.claimed, self.rescheduled, self.ended = 0, 0, {}
        event("executor.progress", seconds=round(seconds, 1), **counts, running=in_flight)
        return True

    async def loop(self, period: float, in_flight: Callable[[], int]) -> None:
        """Every ``period`` seconds (``OUTBOX_PROGRESS_SECONDS``), the line, if busy."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            self.report(now - last, in_flight())
            last = now
