"""Throwaway kinds for the core's own tests."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from outbox_core import (
    Abandoned,
    ActionAdapter,
    ActionAttempt,
    ActionVariants,
    AdapterResult,
    Done,
)


class Step(BaseModel):
    n: int = 0
    note: str | None = None


class NoopAdapter(ActionAdapter):
    """Done at once, without a fence."""

    kind = "TEST_NOOP"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class FencedAdapter(ActionAdapter):
    """Fences once, then Done with a reference."""

    kind = "TEST_FENCED"
    instance_level = True

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Done(f"ref-{attempt.id}")


Script = Callable[[ActionAttempt], Awaitable[AdapterResult]]


class ScriptedAdapter(ActionAdapter):
    """Runs whatever coroutine function the test put in ``script``; records every call."""

    kind = "TEST_SCRIPTED"
    instance_level = True
    script: ClassVar[Script | None] = None
    calls: ClassVar[list[dict[str, Any]]] = []
    endings: ClassVar[list[tuple[int, str, str | None]]] = []

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        type(self).calls.append(
            {
                "id": attempt.id,
                "attempt": attempt.number,
                "epoch": attempt.epoch,
                "write_started": attempt.write_started,
            }
        )
        assert type(self).script is not None, "set ScriptedAdapter.script in the test"
        return await type(self).script(attempt)

    async def ended(self, conn: Any, action: Any) -> None:
        type(self).endings.append((action.id, str(action.state), action.stop_reason))


class AtMostOnceAdapter(ScriptedAdapter):
    kind = "TEST_ONCE"
    at_most_once = True


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Paint(BaseModel):
    color: Color
    finish: Literal["matte", "gloss"] = "matte"


class WorkspaceAdapter(ActionAdapter):
    """A workspace kind (not instance-level) with an enum in its payload."""

    kind = "TEST_PAINT"

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Paint)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        await asyncio.sleep(0)
        return Done()


class SuffixAdapter(ActionAdapter):
    """A kind whose variant is the key's last segment: build 1 knows ``create`` only."""

    kind = "TEST_SUFFIX"
    instance_level = True
    suffixes: ClassVar[tuple[str, ...]] = ("create",)

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.key_suffix(cls.suffixes, Step)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        return Done()


class SuffixAdapterBuild2(SuffixAdapter):
    """The same kind in a newer build, which adds the ``edit`` variant."""

    suffixes = ("create", "edit")
