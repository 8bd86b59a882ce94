"""What a producer asks for: :class:`ActionRequest`, and what enqueue answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One effect to carry out once the caller's transaction commits.

    ``payload`` is a model instance of the kind's variants or a plain JSON object; keep it to
    identifiers where the adapter can read the rest. ``max_attempts`` defaults to the kind's
    ``default_max_attempts``. ``not_before`` delays the first attempt.
    """

    kind: str
    lane_key: str
    idempotency_key: str
    payload: BaseModel | Mapping[str, Any] = field(default_factory=dict)
    workspace_id: str | None = None
    subject_account_id: str | None = None
    max_attempts: int | None = None
    expires_at: datetime | None = None
    not_before: datetime | None = None
    proposed: bool = False


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The action that holds the request's idempotency key, and whether this call made it."""

    id: int
    created: bool
