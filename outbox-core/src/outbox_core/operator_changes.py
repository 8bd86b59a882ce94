"""An operator's resolutions and retries, planned and then written.

Each named action is locked (in id order, in the caller's connection; an executor's ending
that holds one is waited for, and its outcome is what the check reads) and checked against
the rule of the change; a refused action gets a :class:`Refusal` saying why. A dry run, or a
plan with a refusal, writes nothing. Otherwise every change is written in one transaction,
each after its ``action_audit`` row (which the trigger ``guard_agent_action`` requires for a
resolution of an UNCERTAIN action) and with its kind's ``ended`` hook for a resolution that
ends the action, as for any ending. The one-action forms are in :mod:`.operator`.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg import AsyncConnection, Rollback

from .action import Action
from .adapter import ActionAdapter, has_own
from .errors import InvalidFilter, InvalidRequest, OutboxError
from .observability import action_event, count_ending
from .outbox import Outbox
from .requests import ActionRequest
from .results import StopReason
from .search import ActionFilter
from .states import ActionState

Surface = Literal["cli", "dashboard", "api"]
SURFACES: tuple[Surface, ...] = ("cli", "dashboard", "api")

# How far past the old key's retry number a free ``#retry-<n>`` is looked for.
_RETRY_NUMBERS = 20
_RETRY_SUFFIX = re.compile(r"#retry-(\d+)$")


class OperatorRefused(OutboxError):
    """The operator's action was refused; the message says why (nothing was changed)."""


class Resolution(enum.StrEnum):
    """What the operator does to each action; the value is the audit row's ``command``."""

    DONE = "resolve_done"
    ABSENT = "resolve_absent"
    READ_BACK = "resolve_retry"
    RETRY = "retry"


# The states each change acts on: what a filter of the bulk forms chooses among.
ACTS_ON: dict[Resolution, tuple[ActionState, ...]] = {
    Resolution.DONE: (ActionState.UNCERTAIN,),
    Resolution.ABSENT: (ActionState.UNCERTAIN,),
    Resolution.READ_BACK: (ActionState.UNCERTAIN,),
    Resolution.RETRY: (ActionState.FAILED, ActionState.CANCELLED),
}


def among_acted_on(action_filter: ActionFilter, how: Resolution) -> ActionFilter:
    """``action_filter`` narrowed to the states that ``how`` acts on (its own states, when it
    names some, must be among them: :class:`InvalidFilter` on ``states`` else)."""
    allowed = ACTS_ON[how]
    named = tuple(ActionState(str(state)) for state in action_filter.states)
    if any(state not in allowed for state in named):
        raise InvalidFilter("states", f"this change acts on {' or '.join(allowed)} actions only")
    return dataclasses.replace(action_filter, states=named or allowed)


@dataclass(frozen=True, slots=True)
class Change:
    """One action's change: its state before and after (a retry leaves the old one as it is
    and makes ``new_key``); ``action`` as it is after (as it was, in a dry run), ``new_action``
    the action a retry made (None in a dry run)."""

    action_id: int
    kind: str
    before: ActionState
    after: ActionState
    action: Action
    new_key: str | None = None
    new_action: Action | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one named action may not change."""

    action_id: int
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What a change of many actions does (``written``) or would do: every change, and every
    refusal. Nothing is written while there is a refusal."""

    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    written: bool = False


@dataclass(frozen=True, slots=True)
class _Locked:
    action: Action
    at_most_once: bool
    kept_payload: dict[str, Any] | None
    retried_as: int | None


def _checked_input(
    ids: Sequence[int], how: Resolution, reason: str, by: str | None, ref: str | None, surface: str
) -> list[int]:
    if not ids:
        raise InvalidRequest("ids", "name at least one action")
    if any(not isinstance(i, int) or isinstance(i, bool) or i < 1 for i in ids):
        raise InvalidRequest("ids", "an action id is a whole number from 1")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidRequest("reason", "say why (it is kept in the action's audit)")
    check_actor(by, surface)
    if how is Resolution.DONE and (not isinstance(ref, str) or not ref.strip()):
        raise InvalidRequest("ref", "name the provider's reference of the effect found")
    return sorted(set(ids))


def check_actor(by: str | None, surface: str) -> None:
    """Who (None: the database role) and from where, as every audit row names them."""
    if by is not None and (not isinstance(by, str) or not by.strip()):
        raise InvalidRequest("by", "name who does it, or leave it out for the database role")
    if surface not in SURFACES:
        raise InvalidRequest("surface", f"one of {', '.join(SURFACES)}, not {surface!r}")


async def _lock(conn: AsyncConnection[Any], outbox: Outbox, ids: list[int]) -> dict[int, _Locked]:
    cursor = await conn.execute(outbox.queries["operator_lock_actions"], {"ids": ids})
    return {
        row[0]: _Locked(Action.from_row(row[:21]), row[21], row[22], row[23])
        for row in await cursor.fetchall()
    }


_GONE = (
    "no action {id} (retention or an erasure deletes an action with its payload and audit: "
    "enqueue the effect again from the application if it is still wanted)"
)


def _refusal(outbox: Outbox, how: Resolution, locked: _Locked) -> str | None:
    """Why ``how`` may not change the action, or None."""
    action = locked.action
    name = f"action {action.id} ({action.kind})"
    if action.kind not in outbox.registry:
        return (
            f"{name}: no installed plugin registers {action.kind} here, and its ended hook "
            "must run with the change: run the command where the kind's plugin is installed"
        )
    if how is Resolution.RETRY:
        return _retry_refusal(name, locked)
    if action.state is not ActionState.UNCERTAIN:
        hint = (
            " (run it again with `outbox retry`)"
            if action.state in (ActionState.FAILED, ActionState.CANCELLED)
            else ""
        )
        return f"{name} is {action.state}: only an UNCERTAIN action is resolved{hint}"
    if how is Resolution.READ_BACK:
        if locked.at_most_once:
            return (
                f"{name} is of an at-most-once kind, which cannot be read back: check the "
                "provider, then resolve it with --done --ref REF or --not-done"
            )
        if action.write_started_at is None:
            return (
                f"{name}: its write never started, so there is nothing to read back: resolve "
                "it with --not-done, then run it again with `outbox retry`"
            )
        if locked.kept_payload is None:
            return f"{name} keeps no payload to read back with " + _NO_PAYLOAD
    return None


_NO_PAYLOAD = (
    "(it ended before migration 0018 kept the payloads of actions that end UNCERTAIN, FAILED "
    "or CANCELLED): enqueue the effect again from the application"
)


def _retry_refusal(name: str, locked: _Locked) -> str | None:
    action = locked.action
    if action.state is ActionState.UNCERTAIN:
        return (
            f"{name} is UNCERTAIN: the effect may exist; resolve it first with `outbox "
            "resolve` (--done --ref REF, --not-done, or --retry to read it back)"
        )
    if action.state not in (ActionState.FAILED, ActionState.CANCELLED):
        return f"{name} is {action.state}: only a FAILED or CANCELLED action is run again"
    if (
        locked.at_most_once
        and action.write_started_at is not None
        and action.stop_reason != StopReason.RESOLVED_ABSENT
    ):
        return (
            f"{name} is of an at-most-once kind and its write started at "
            f"{action.write_started_at.isoformat()}: the effect may exist, and a second "
            "action could make it twice; check the provider and enqueue it again from the "
            "application if it is absent"
        )
    if locked.retried_as is not None:
        return (
            f"{name} was run again already as action {locked.retried_as}: retry that one if "
            "it failed too"
        )
    if locked.kept_payload is None:
        return f"{name} keeps no payload to run again with " + _NO_PAYLOAD
    return None


async def _free_retry_key(conn: AsyncConnection[Any], outbox: Outbox, key: str) -> str | None:
    """``<base>#retry-<n>`` with the first n after the old key's own that no action holds."""
    found = _RETRY_SUFFIX.search(key)
    base, number = (key[: found.start()], int(found.group(1))) if found else (key, 0)
    candidates = [f"{base}#retry-{n}" for n in range(number + 1, number + 1 + _RETRY_NUMBERS)]
    cursor = await conn.execute(outbox.queries["actions_by_keys"], {"keys": candidates})
    taken = {row[4] for row in await cursor.fetchall()}
    return next((c for c in candidates if c not in taken), None)


async def _plan(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    ids: list[int],
    how: Resolution,
) -> tuple[Plan, dict[int, _Locked]]:
    """Lock and check the actions in ``conn``'s transaction; write nothing."""
    locked = await _lock(conn, outbox, ids)
    changes: list[Change] = []
    refusals: list[Refusal] = []
    for action_id in ids:
        one = locked.get(action_id)
        if one is None:
            refusals.append(Refusal(action_id, _GONE.format(id=action_id)))
            continue
        why = _refusal(outbox, how, one)
        new_key = None
        if why is None and how is Resolution.RETRY:
            new_key = await _free_retry_key(conn, outbox, one.action.idempotency_key)
            if new_key is None:
                why = f"action {action_id}: no free key {one.action.idempotency_key}#retry-<n>"
        if why is not None:
            refusals.append(Refusal(action_id, why))
            continue
        after = {
            Resolution.DONE: ActionState.DONE,
            Resolution.ABSENT: ActionState.FAILED,
            Resolution.READ_BACK: ActionState.ADMITTED,
            Resolution.RETRY: one.action.state,
        }[how]
        changes.append(
            Change(action_id, one.action.kind, one.action.state, after, one.action, new_key)
        )
    return Plan(changes, refusals), locked


def written_or_refused(plan: Plan) -> list[Change]:
    """The changes of a written plan; :class:`OperatorRefused`, naming every refusal, else."""
    if plan.refusals:
        raise OperatorRefused("; ".join(r.why for r in plan.refusals) + ": nothing was changed")
    return plan.changes


async def change_many(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    ids: Sequence[int],
    how: Resolution,
    reason: str,
    by: str | None = None,
    *,
    ref: str | None = None,
    surface: Surface = "api",
    dry_run: bool = False,
) -> Plan:
    """Change every action of ``ids`` as ``how`` says, in one transaction of ``conn`` that is
    committed, or none of them: the :class:`Plan` says what changed (``written``), or, for a
    ``dry_run`` or when an action is refused, what would change and what is refused (then
    nothing was written). :class:`~outbox_core.InvalidRequest` for bad input."""
    wanted = _checked_input(ids, how, reason, by, ref, surface)
    audit = {"reason": reason.strip(), "by": by, "surface": surface, "command": str(how)}
    written: list[Change] = []
    async with conn.transaction():
        plan, locked = await _plan(conn, outbox, wanted, how)
        if dry_run or plan.refusals:
            raise Rollback  # ends this block only, with nothing written
        adapters: dict[str, ActionAdapter] = {}
        for change in plan.changes:
            one = locked[change.action_id]
            written.append(await _write(conn, outbox, change, one, audit, ref, adapters))
    if dry_run or plan.refusals:
        return plan
    if not conn.autocommit:
        await conn.commit()
    for change in written:
        # A resolution that ended the action; a retry leaves the old one as it ended.
        if change.after.ended and change.new_key is None:
            ended = change.action
            count_ending(ended.kind, str(ended.state), ended.stop_reason)
    return Plan(written, [], written=True)


async def _write(
    conn: AsyncConnection[Any],
    outbox: Outbox,
    change: Change,
    locked: _Locked,
    audit: dict[str, Any],
    ref: str | None,
    adapters: dict[str, ActionAdapter],
) -> Change:
    old = change.action
    row_audit = {**audit, "id": old.id, "before": str(old.state), "related": None, "ref": None}
    if change.new_key is not None:  # a retry
        request = ActionRequest(
            old.kind,
            old.lane_key,
            change.new_key,
            payload=locked.kept_payload or {},
            workspace_id=old.workspace_id,
            subject_account_id=old.subject_account_id,
            max_attempts=old.max_attempts,
        )
        made = await outbox.aenqueue(conn, request)
        if not made.created:
            raise OperatorRefused(
                f"action {old.id}: the key {change.new_key} was taken meanwhile: nothing was "
                "changed"
            )
        queries = outbox.queries["audit_write"]
        await conn.execute(queries, {**row_audit, "after": str(old.state), "related": made.id})
        await conn.execute(
            queries,
            {**row_audit, "id": made.id, "before": None, "after": "ADMITTED", "related": old.id},
        )
        new_action = await outbox.aget(conn, made.id)
        action_event("action.retried", old.id, old.kind, new_action_id=made.id)
        return Change(
            change.action_id,
            change.kind,
            change.before,
            change.after,
            old,
            change.new_key,
            new_action,
        )
    await conn.execute(
        outbox.queries["audit_write"], {**row_audit, "after": str(change.after), "ref": ref}
    )
    if change.after is ActionState.ADMITTED:
        cursor = await conn.execute(outbox.queries["resolve_readback"], {"id": old.id})
    else:
        stop = (
            StopReason.RESOLVED_DONE
            if change.after is ActionState.DONE
            else StopReason.RESOLVED_ABSENT
        )
        params = {"id": old.id, "state": str(change.after), "reason": stop, "ref": ref}
        cursor = await conn.execute(outbox.queries["resolve_ended"], params)
    row = await cursor.fetchone()
    assert row is not None, "locked and checked UNCERTAIN in this transaction"
    action = Action.from_row(row[:21])
    if action.state.ended:
        adapter = adapters.get(action.kind)
        if adapter is None:
            adapter = outbox.registry.get(action.kind).adapter.build(outbox.settings)
            adapters[action.kind] = adapter
        if has_own(type(adapter), "ended"):
            try:
                await adapter.ended(conn, action)
            except Exception as exc:
                # The whole change rolls back with this error (the transaction's block).
                raise OperatorRefused(
                    f"action {action.id} ({action.kind}): its kind's ended hook refused the "
                    f"resolution ({exc}); for --done give the reference in the form the kind "
                    "reads back (docs/operations.md): nothing was changed"
                ) from exc
    action_event("action.resolved", action.id, action.kind, state=str(action.state))
    return Change(change.action_id, change.kind, change.before, change.after, action)


async def audit_of(
    conn: AsyncConnection[Any], outbox: Outbox, action_id: int
) -> list[dict[str, Any]]:
    """The audit rows of one action, oldest first, as dicts."""
    cursor = await conn.execute(outbox.queries["audit_of_action"], {"id": action_id})
    names = [column.name for column in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]
