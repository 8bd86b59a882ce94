"""A stand-in for outbox-draft, registered as a plugin of the tests: it implements the draft
hook (only while ``ENABLED``) and a DRAFT_REPORT kind that keeps an answer on the filing."""

from __future__ import annotations

from typing import Any, ClassVar

from psycopg import AsyncConnection
from pydantic import BaseModel

from outbox_core import (
    Action,
    ActionAdapter,
    ActionAttempt,
    ActionRequest,
    ActionVariants,
    Done,
    hookimpl,
)
from outbox_issues import domain
from outbox_issues.hookspecs import DraftContext

ENABLED = False
LANE: str | None = None
"""A lane to answer instead of the one asked for (a broken draft plugin)."""


class DraftPayload(BaseModel):
    report: str
    generation: int


class DraftAdapter(ActionAdapter):
    kind = "DRAFT_REPORT"
    calls: ClassVar[list[tuple[str, int]]] = []

    @classmethod
    def variants(cls) -> ActionVariants:
        return ActionVariants.one(DraftPayload)

    async def execute(self, attempt: ActionAttempt) -> Done:
        payload = attempt.body
        assert isinstance(payload, DraftPayload)
        self.calls.append((payload.report, payload.generation))
        async with attempt.transaction() as conn:
            await domain.draft_claimed(conn, "outbox", payload.report)
            await domain.keep_answer(
                conn,
                "outbox",
                payload.report,
                payload.generation,
                title=f"Drafted title {payload.generation}",
                body=f"Drafted summary {payload.generation}",
            )
        return Done()

    async def ended(self, conn: AsyncConnection[Any], action: Action) -> None:
        await domain.draft_ended(conn, "outbox", action.idempotency_key.split(":")[1])


def serve(db: Any) -> None:
    """Register :class:`DraftAdapter` for one test, in place of an installed DRAFT_REPORT (the
    real outbox-draft, when a checkout has it installed too)."""
    if DraftAdapter.kind in db.registry:
        db.registry.unregister(DraftAdapter.kind)
    db.register_kind(DraftAdapter)


@hookimpl
def outbox_issues_draft_request(draft: DraftContext) -> ActionRequest | None:
    if not ENABLED:
        return None
    return ActionRequest(
        kind="DRAFT_REPORT",
        lane_key=LANE or draft.lane_key,
        idempotency_key=draft.idempotency_key,
        payload={"report": draft.report_id, "generation": draft.generation},
        workspace_id=draft.workspace_id,
        max_attempts=3,
    )
