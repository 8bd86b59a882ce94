"""The action lifecycle: the one table of allowed transitions.

The trigger ``guard_agent_action`` (``sql/migrations/core/0001_schema.sql``, last restated in
``0018_operator_audit.sql``) enforces the same table, and the operator's :data:`RESOLUTIONS`;
``tests/test_lifecycle_trigger.py`` tries every ordered pair of states against the live
trigger, with and without an operator's audit row, generated from both tables, so the trigger
and the tables cannot drift apart.
"""

from __future__ import annotations

import enum


class ActionState(enum.StrEnum):
    """Where an action is in its life. The value is what the ``state`` column holds."""

    PROPOSED = "PROPOSED"
    ADMITTED = "ADMITTED"
    EXECUTING = "EXECUTING"
    DONE = "DONE"
    UNCERTAIN = "UNCERTAIN"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        """An ended action never changes again and keeps no payload."""
        return self in ENDED_STATES

    def may_become(self, other: ActionState) -> bool:
        """Whether the lifecycle allows a change of state from ``self`` to ``other``."""
        return other in TRANSITIONS[self]


ENDED_STATES: frozenset[ActionState] = frozenset(
    {ActionState.DONE, ActionState.UNCERTAIN, ActionState.FAILED, ActionState.CANCELLED}
)

LIVE_STATES: frozenset[ActionState] = frozenset(ActionState) - ENDED_STATES

# The specification's table "The lifecycle". EXECUTING -> EXECUTING is the reclaim after an
# expired lease (the epoch and the attempt rise by one). Same-state updates of the other live
# states (a new due time, a lease extension by its holder) are updates, not transitions: the
# trigger allows them without an epoch change; ended rows allow none at all.
TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.PROPOSED: frozenset({ActionState.ADMITTED, ActionState.CANCELLED}),
    ActionState.ADMITTED: frozenset({ActionState.EXECUTING, ActionState.CANCELLED}),
    ActionState.EXECUTING: frozenset(
        {
            ActionState.EXECUTING,
            ActionState.ADMITTED,
            ActionState.DONE,
            ActionState.UNCERTAIN,
            ActionState.FAILED,
            ActionState.CANCELLED,
        }
    ),
    ActionState.DONE: frozenset(),
    ActionState.UNCERTAIN: frozenset(),
    ActionState.FAILED: frozenset(),
    ActionState.CANCELLED: frozenset(),
}

# An operator's resolutions of an UNCERTAIN action (outbox_core/operator.py, `outbox resolve`):
# DONE (the operator found the effect, with its reference; stop reason RESOLVED_DONE), FAILED
# (it does not exist; RESOLVED_ABSENT), ADMITTED (a read-back kind whose write started reads
# back again, as after a lost lease). The trigger allows each only in a transaction that wrote
# the action's audit row of that change, so no executor path can take them; they are not in
# TRANSITIONS, the executor's lifecycle.
RESOLUTIONS: dict[ActionState, frozenset[ActionState]] = {
    state: frozenset() for state in ActionState
} | {
    ActionState.UNCERTAIN: frozenset({ActionState.DONE, ActionState.FAILED, ActionState.ADMITTED}),
}

# A transition into EXECUTING is a claim: it must raise the epoch and the attempt by one.
CLAIM_TARGET = ActionState.EXECUTING


def allows(old: ActionState, new: ActionState, *, resolution: bool = False) -> bool:
    """Whether an update of a row in ``old`` that leaves it in ``new`` is allowed: a listed
    transition, or an in-place update of a live state. An ended row allows nothing, but for an
    operator's ``resolution`` (:data:`RESOLUTIONS`) of an UNCERTAIN one."""
    if resolution and new in RESOLUTIONS[old]:
        return True
    return new in TRANSITIONS[old] or (old is new and not old.ended)
