"""Actions put where an operator finds them, through a real executor: UNCERTAIN after a write
may have started, FAILED, CANCELLED; and their audit rows."""

from __future__ import annotations

from typing import Any

from outbox_core import (
    Abandoned,
    ActionAttempt,
    ActionRequest,
    AdapterResult,
    Failed,
    Uncertain,
)
from outbox_core.testing import OutboxTestDatabase

from .kinds import ScriptedAdapter


async def fence_then_uncertain(attempt: ActionAttempt) -> AdapterResult:
    if not await attempt.fence().begin_write():
        return Abandoned()
    return Uncertain()


async def fence_then_failed(attempt: ActionAttempt) -> AdapterResult:
    if not await attempt.fence().begin_write():
        return Abandoned()
    return Failed("REFUSED")


async def failed_before_writing(attempt: ActionAttempt) -> AdapterResult:
    return Failed("REFUSED")


async def ended_by_executor(
    db: OutboxTestDatabase,
    script: Any,
    key: str,
    *,
    kind: str = "TEST_SCRIPTED",
    payload: dict[str, Any] | None = None,
    subject: str | None = None,
) -> int:
    """An action of ``kind`` enqueued and run once by an executor with ``script``."""
    ScriptedAdapter.script = script
    with db.connect() as conn:
        request = ActionRequest(
            kind,
            f"lane-{key}",
            key,
            payload=payload if payload is not None else {"n": 1},
            subject_account_id=subject,
            max_attempts=1,
        )
        action_id = db.outbox.enqueue(conn, request).id
        conn.commit()
    await db.adrain()
    return action_id


def row(db: OutboxTestDatabase, action_id: int) -> tuple[Any, ...]:
    found = db.rows(
        "SELECT state, stop_reason, readback_ref, payload FROM {schema}.agent_action WHERE id = %s",
        (action_id,),
    )
    assert found, f"action {action_id} is gone"
    return found[0]


def audits(db: OutboxTestDatabase, action_id: int) -> list[tuple[Any, ...]]:
    return db.rows(
        "SELECT actor, command, reason, surface, before_state, after_state, related_action_id, "
        "readback_ref FROM {schema}.action_audit WHERE action_id = %s ORDER BY id",
        (action_id,),
    )
