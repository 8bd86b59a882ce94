"""What an adapter returns from ``execute``, and the reasons an action stops.

The specification's table "What an adapter returns" maps each result to what the executor
does with the action; ``outbox_core.executor.outcomes`` holds that mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Final


class StopReason:
    """The core's stop reasons. A kind may declare more (``ActionAdapter.stop_reasons``)."""

    COMPLETED: Final = "COMPLETED"
    ATTEMPTS_EXHAUSTED: Final = "ATTEMPTS_EXHAUSTED"
    LEASE_LOST_AFTER_WRITE: Final = "LEASE_LOST_AFTER_WRITE"
    ABSENT: Final = "ABSENT"
    EXPIRED: Final = "EXPIRED"
    NOT_CONFIGURED: Final = "NOT_CONFIGURED"
    REFUSED: Final = "REFUSED"
    UNDELIVERABLE: Final = "UNDELIVERABLE"
    WRITE_UNCONFIRMED: Final = "WRITE_UNCONFIRMED"
    CANCELLED: Final = "CANCELLED"
    REFUSED_PROPOSAL: Final = "REFUSED_PROPOSAL"
    OPERATOR_CANCELLED: Final = "OPERATOR_CANCELLED"
    UNDECODABLE: Final = "UNDECODABLE"

    @classmethod
    def core(cls) -> frozenset[str]:
        return frozenset(
            value for name, value in vars(cls).items() if name.isupper() and isinstance(value, str)
        )


@dataclass(frozen=True, slots=True)
class Done:
    """The provider confirmed the effect. The action ends DONE with ``readback_ref``."""

    readback_ref: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """The provider proved it holds nothing; a later attempt may succeed.

    ADMITTED again after ``after`` (the kind's backoff when None), or FAILED with
    ATTEMPTS_EXHAUSTED at the last attempt. The fence is cleared.
    """

    after: timedelta | None = None
    why: str | None = None


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now, and nothing was written (a rate limit). ADMITTED after ``after``; the attempt
    does not count."""

    after: timedelta
    event: str | None = None


@dataclass(frozen=True, slots=True)
class Reread:
    """The effect may exist and the provider can be read back. The action stays EXECUTING
    with its fence; the lease ends after ``after`` and the next attempt reads back first.
    At the last attempt the action ends UNCERTAIN."""

    after: timedelta = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Uncertain:
    """The effect may exist. UNCERTAIN; nothing sends it again."""

    reason: str = StopReason.WRITE_UNCONFIRMED


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider refused it, or nobody can receive it. FAILED."""

    reason: str = StopReason.REFUSED


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Nothing should be written. CANCELLED."""

    reason: str = StopReason.CANCELLED


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The fence refused: another holder owns the action. Nothing changes."""


AdapterResult = Done | Retry | Defer | Reread | Uncertain | Failed | Cancelled | Abandoned
