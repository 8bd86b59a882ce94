"""An action as read from the table: what ``ended`` hooks and readers receive."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .states import ActionState

# The columns every reader selects, in this order (see sql/queries.sql).
ACTION_COLUMNS = (
    "id, kind, workspace_id, lane_key, idempotency_key, payload, subject_account_id, state, "
    "attempt, max_attempts, epoch, due_at, expires_at, lease_until, write_started_at, ended_at, "
    "stop_reason, readback_ref, last_result, created_at, last_detail"
)


_STATES = {str(state): state for state in ActionState}


@dataclass(frozen=True, slots=True)
class Action:
    """One row of ``agent_action``. ``payload`` is None once the action ended."""

    id: int
    kind: str
    workspace_id: str | None
    lane_key: str
    idempotency_key: str
    payload: dict[str, Any] | None
    subject_account_id: str | None
    state: ActionState
    attempt: int
    max_attempts: int
    epoch: int
    due_at: datetime
    expires_at: datetime | None
    lease_until: datetime | None
    write_started_at: datetime | None
    ended_at: datetime | None
    stop_reason: str | None
    readback_ref: str | None
    last_result: str | None
    created_at: datetime
    # Why the last attempt came out as ``last_result`` says, in the adapter's words (a
    # provider's code and a short reason; see outbox_core.results). None from a row read
    # without it.
    last_detail: str | None = None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Action:
        """Build from a row selected with :data:`ACTION_COLUMNS`."""
        values = list(row)
        values[7] = _STATES[values[7]]
        return cls(*values)

    def as_dict(self, *, with_payload: bool = False) -> dict[str, Any]:
        """A JSON-friendly view; the payload only when asked for (it may hold personal data)."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            if name == "payload" and not with_payload:
                continue
            value = getattr(self, name)
            out[name] = value.isoformat() if isinstance(value, datetime) else value
        out["state"] = str(self.state)
        return out
