"""The kind the ORM tests enqueue: Done at once, remembering which actions it ran."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from outbox_core import ActionAdapter, ActionAttempt, ActionVariants, AdapterResult, Done


class Confirmation(BaseModel):
    order_id: int


class ConfirmAdapter(ActionAdapter):
    kind = "TEST_CONFIRM"
    instance_level = True
    ran: ClassVar[list[int]] = []

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(Confirmation)

    async def execute(self, attempt: ActionAttempt) -> AdapterResult:
        type(self).ran.append(attempt.id)
        return Done()
