"""What an adapter returns from ``execute``, and the reasons an action stops.

The specification's table "What an adapter returns" maps each result to what the executor
does with the action; ``outbox_core.executor.outcomes`` holds that mapping.

Every result carries ``detail``: why the attempt came out this way, in a short text the
adapter chooses, starting with the provider's code where it has one (``"SMTP 451 4.7.1 at
RCPT"``, ``"Slack ratelimited"``, ``"HTTP 422 Validation Failed"``). The executor keeps the
last attempt's detail on the action (``last_detail``, beside ``last_result``), where
``outbox show`` and ``outbox status`` show it, also once the action ended; an attempt that
raised gets ``"raised <exception type>"``. The executor replaces control characters with
spaces and cuts the text to :data:`DETAIL_LIMIT` characters.

A detail is read by operators and kept with the row until retention (or an erasure) deletes
it: it must never hold the payload or any part of it, an address, a name, a token or another
secret. Write codes and the provider's own words about
the failure; leave out a provider's free text when it may quote what was sent (an SMTP reply
can quote the recipient).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Final

# The longest detail kept on an action, in characters; a longer one is cut.
DETAIL_LIMIT: Final = 200


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
    # A read-back kind's provider stayed unreadable for longer than the kind's
    # ``unreadable_for`` after its write may have started: given up as uncertain.
    READBACK_UNAVAILABLE: Final = "READBACK_UNAVAILABLE"
    # An operator's resolution of an UNCERTAIN action (`outbox resolve`): the effect exists
    # (DONE, with the reference the operator found), or it does not (FAILED).
    RESOLVED_DONE: Final = "RESOLVED_DONE"
    RESOLVED_ABSENT: Final = "RESOLVED_ABSENT"

    @classmethod
    def core(cls) -> frozenset[str]:
        return frozenset(
            value for name, value in vars(cls).items() if name.isupper() and isinstance(value, str)
        )


@dataclass(frozen=True, slots=True)
class Done:
    """The provider confirmed the effect. The action ends DONE with ``readback_ref``."""

    readback_ref: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """The provider proved it holds nothing; a later attempt may succeed.

    ADMITTED again after ``after`` (the kind's backoff when None), or FAILED with
    ATTEMPTS_EXHAUSTED at the last attempt. The fence is cleared.
    """

    after: timedelta | None = None
    # The older name of ``detail``, kept for adapters written before it: used when ``detail``
    # is None.
    why: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now, and nothing was written (a rate limit). ADMITTED after ``after``; the attempt
    does not count."""

    after: timedelta
    event: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Reread:
    """The effect may exist and the provider can be read back. The action stays EXECUTING
    with its fence; the lease ends after the wait and the next attempt reads back first.

    ``after``: None (the default, for "could not read, try again"), the core picks the wait:
    it grows, with jitter, from the kind's ``reread_base`` towards its ``reread_cap`` as the
    action waits on reads; a value is the adapter's own wait (a provider's ``Retry-After``, a
    listing lag it knows), used as given, only cut so that it does not run past the end of
    the kind's ``unreadable_for``.

    Writes are bounded by attempts, reads by time: a Reread from an attempt that called
    ``begin_write()`` counts an attempt, and at the last attempt the action ends UNCERTAIN
    ``ATTEMPTS_EXHAUSTED`` (so does one when no write ever started: there is nothing to read
    back); a Reread from an attempt that only read an earlier write counts none (as a Defer),
    and once the provider has been unreadable for ``unreadable_for`` since the write started
    (on the database clock) it ends UNCERTAIN ``READBACK_UNAVAILABLE``. Say in ``detail`` what
    the read saw (``"conversations.history HTTP 503: not read"``)."""

    after: timedelta | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Uncertain:
    """The effect may exist. UNCERTAIN; nothing sends it again."""

    reason: str = StopReason.WRITE_UNCONFIRMED
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider refused it, or nobody can receive it. FAILED."""

    reason: str = StopReason.REFUSED
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Nothing should be written. CANCELLED."""

    reason: str = StopReason.CANCELLED
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The fence refused: another holder owns the action. Nothing changes (its ``detail`` is
    not kept: the action is the other holder's)."""

    detail: str | None = None


AdapterResult = Done | Retry | Defer | Reread | Uncertain | Failed | Cancelled | Abandoned
