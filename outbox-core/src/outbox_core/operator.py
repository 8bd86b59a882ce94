"""What an operator may do to an action, with the refusals that keep it safe: cancel an action
that has not started, run a due lane head now, resolve an UNCERTAIN action (done, not done,
read back again) and run a FAILED or CANCELLED one again. ``outbox cancel``, ``run-now``,
``resolve``, ``retry`` and the dashboard's buttons call these, so each refusal reads the same
everywhere. Each is audited: one ``action_audit`` row per change (who, why, from which
surface), deleted with the action; :mod:`.operator_changes` plans and writes resolutions and
retries, this module writes the rows of a cancel and a run-now."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from .action import Action
from .errors import InvalidRequest
from .observability import count_ending
from .operator_changes import (
    Change,
    OperatorRefused,
    Resolution,
    Surface,
    change_many,
    check_actor,
    written_or_refused,
)
from .outbox import Outbox
from .states import ActionState

__all__ = [
    "OperatorRefused",
    "cancel_unstarted",
    "resolve_absent",
    "resolve_done",
    "resolve_retry",
    "retry",
    "run_now",
]


# The audit's reason when the operator gave none (cancel and run-now do not ask for one).
NO_REASON = "no reason given"


async def cancel_unstarted(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    *,
    reason: str | None = None,
    by: str | None = None,
    surface: Surface = "api",
) -> Action:
    """Cancel an action that has not started (PROPOSED or ADMITTED) as an operator, and commit
    it with its audit row (command ``cancel``; ``by`` None: the database role); its kind's
    ``ended`` runs in that transaction. :class:`OperatorRefused` (nothing changed) for an
    action that does not exist, has started, or ended."""
    audit = _audit_fields(reason, by, surface)
    cancelled = await outbox.acancel(conn, action_id)
    if cancelled is not None:
        await _audit(conn, outbox, cancelled, "cancel", audit, before=None)
        await conn.commit()
        count_ending(cancelled.kind, str(cancelled.state), cancelled.stop_reason)
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


async def run_now(
    outbox: Outbox,
    conninfo: str,
    action_id: int,
    *,
    reason: str | None = None,
    by: str | None = None,
    surface: Surface = "api",
) -> Action:
    """Claim and carry out one admitted lane head at once, through an executor of its own
    (``Executor.run_now``: claimed and fenced as any claim), then write its audit row (command
    ``run_now``, the state after). The action as it is afterwards; :class:`OperatorRefused`
    when it is not a claimable head (nothing is audited then)."""
    from .executor import Executor

    audit = _audit_fields(reason, by, surface)
    async with Executor(outbox, conninfo) as executor:
        done = await executor.run_now(action_id)
    async with await AsyncConnection.connect(conninfo, autocommit=True) as conn:
        if done is not None:
            await _audit(conn, outbox, done, "run_now", audit, before=ActionState.ADMITTED)
            return done
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


def _audit_fields(reason: str | None, by: str | None, surface: Surface) -> dict[str, Any]:
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise InvalidRequest("reason", "say why, or leave it out")
    check_actor(by, surface)
    return {"reason": (reason or NO_REASON).strip(), "by": by, "surface": surface}


async def _audit(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action: Action,
    command: str,
    audit: dict[str, Any],
    before: ActionState | None,
) -> None:
    """The audit row of a cancel or a run-now, in ``conn``'s transaction."""
    await conn.execute(
        outbox.queries["audit_write"],
        {
            **audit,
            "id": action.id,
            "command": command,
            "before": None if before is None else str(before),
            "after": str(action.state),
            "related": None,
            "ref": None,
        },
    )


# -- resolve and retry: the one-action forms of operator_changes.change_many -----------------


async def _one(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    how: Resolution,
    reason: str,
    by: str | None,
    surface: Surface,
    ref: str | None,
) -> Change:
    plan = await change_many(conn, outbox, [action_id], how, reason, by, ref=ref, surface=surface)
    return written_or_refused(plan)[0]


async def resolve_done(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    ref: str,
    reason: str,
    by: str | None = None,
    *,
    surface: Surface = "api",
) -> Action:
    """End an UNCERTAIN action DONE (``RESOLVED_DONE``) with ``ref``, the reference the operator
    found at the provider (the effect exists); its kind's ``ended`` runs in the transaction,
    which is committed. ``by`` names who (default: the database role); ``reason`` is required.
    :class:`OperatorRefused` (nothing changed) for an action that is not UNCERTAIN."""
    return (await _one(conn, outbox, action_id, Resolution.DONE, reason, by, surface, ref)).action


async def resolve_absent(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    reason: str,
    by: str | None = None,
    *,
    surface: Surface = "api",
) -> Action:
    """End an UNCERTAIN action FAILED with ``RESOLVED_ABSENT`` (the operator checked: the effect
    does not exist); its kind's ``ended`` runs, and :func:`retry` may then run it again (also for
    an at-most-once kind: the check showed nothing was written). Committed."""
    return (
        await _one(conn, outbox, action_id, Resolution.ABSENT, reason, by, surface, None)
    ).action


async def resolve_retry(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    reason: str,
    by: str | None = None,
    *,
    surface: Surface = "api",
) -> Action:
    """Read an UNCERTAIN action of a read-back kind back again: ADMITTED, due now, with the
    payload kept at its ending and its fence's mark, so its next attempt looks for the earlier
    write before it writes (as after a lost lease; never a blind write). Refused for an
    at-most-once kind, and for an action whose write never started. Committed."""
    return (
        await _one(conn, outbox, action_id, Resolution.READ_BACK, reason, by, surface, None)
    ).action


async def retry(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    action_id: int,
    reason: str,
    by: str | None = None,
    *,
    surface: Surface = "api",
) -> Action:
    """Run a FAILED or CANCELLED action again: a new action of the same kind, payload (the one
    kept at its ending), lane, workspace and subject, under the key ``<key>#retry-<n>``, linked
    to the old one by an audit row on each. The new action, committed. Refused for an
    UNCERTAIN action (resolve it first), for an at-most-once kind whose write started (unless
    resolved absent), for an action retried already, and once the payload is gone."""
    new = (
        await _one(conn, outbox, action_id, Resolution.RETRY, reason, by, surface, None)
    ).new_action
    assert new is not None
    return new
