"""What an operator may do to one action, with the refusals that keep it safe: cancel an action
that has not started, and run a due lane head now. ``outbox cancel``, ``outbox run-now`` and
the dashboard's buttons call these, so each refusal reads the same everywhere."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from .action import Action
from .errors import OutboxError
from .outbox import Outbox
from .states import ActionState


class OperatorRefused(OutboxError):
    """The operator's action was refused; the message says why (nothing was changed)."""


async def cancel_unstarted(conn: AsyncConnection[Any], outbox: Outbox, action_id: int) -> Action:
    """Cancel an action that has not started (PROPOSED or ADMITTED) as an operator, and commit;
    its kind's ``ended`` runs in that transaction. :class:`OperatorRefused` (nothing changed)
    for an action that does not exist, has started, or ended."""
    cancelled = await outbox.acancel(conn, action_id)
    if cancelled is not None:
        await conn.commit()
        return cancelled
    cursor = await conn.execute(outbox.queries["action_by_id"], {"id": action_id})
    row = await cursor.fetchone()
    await conn.rollback()
    if row is None:
        raise OperatorRefused(f"no action {action_id}")
    action = Action.from_row(row)
    if action.state == ActionState.ADMITTED and action.write_started_at is not None:
        raise OperatorRefused(
            f"action {action_id} waits out a deferral after its write started (the effect may "
            "exist): it is read back, not cancelled"
        )
    raise OperatorRefused(
        f"action {action_id} is {action.state}: only an action that has not started (PROPOSED "
        "or ADMITTED) can be cancelled"
    )


async def run_now(outbox: Outbox, conninfo: str, action_id: int) -> Action:
    """Claim and carry out one admitted lane head at once, through an executor of its own
    (``Executor.run_now``: claimed and fenced as any claim). The action as it is afterwards;
    :class:`OperatorRefused` when it is not a claimable head."""
    from .executor import Executor

    async with Executor(outbox, conninfo) as executor:
        done = await executor.run_now(action_id)
        if done is not None:
            return done
        async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
            cursor = await conn.execute(outbox.queries["action_by_id"], {"id": action_id})
            row = await cursor.fetchone()
    if row is None:
        raise OperatorRefused(f"no action {action_id}")
    action = Action.from_row(row)
    if action.state != ActionState.ADMITTED:
        raise OperatorRefused(
            f"action {action_id} is {action.state}: only an admitted action can be run now"
        )
    raise OperatorRefused(
        f"action {action_id} is not the head of lane {action.lane_key!r} (an earlier action "
        "of the lane runs first), or another executor holds it, or this build does not serve "
        f"its kind {action.kind}: it was not run"
    )
