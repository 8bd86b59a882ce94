"""From an adapter's result (or exception) to the write that ends or reschedules the action.

The specification's table "What an adapter returns", as one function. Pure: the tests run
every row of the table through :func:`decide` and through the live executor.
"""

from __future__ import annotations

import functools
import random
import re
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

from ..results import (
    DETAIL_LIMIT,
    Abandoned,
    AdapterResult,
    Cancelled,
    Defer,
    Done,
    Failed,
    Reread,
    Retry,
    StopReason,
    Uncertain,
)
from ..states import ActionState

FencePolicy = Literal["keep", "clear", "restore"]


# Ending and AttemptFacts are built once or twice per action: named tuples, immutable like a
# frozen dataclass but built in a quarter of the time (0.3 against 1.2 us for eleven fields).


class Ending(NamedTuple):
    """One conditional write on the action: applied only while the action is still in
    ``from_state`` at ``epoch`` (a write naming an older epoch changes nothing)."""

    action_id: int
    kind: str
    lane_key: str
    epoch: int
    from_state: ActionState
    state: ActionState
    result: str
    stop_reason: str | None = None
    readback_ref: str | None = None
    delay: timedelta | None = None
    fence: FencePolicy = "keep"
    uncount: int = 0
    event: str | None = None
    prior_write: datetime | None = None
    detail: str | None = None


class AttemptFacts(NamedTuple):
    """What decide() needs to know about the attempt. Every time in it is the database's."""

    action_id: int
    kind: str
    lane_key: str
    epoch: int
    number: int
    max_attempts: int
    at_most_once: bool
    # This attempt's begin_write() passed (its write may have reached the provider).
    fenced: bool
    # This attempt called begin_write(), passed or refused: it meant to write, and its Reread
    # counts an attempt.
    began_write: bool
    retry_base: timedelta
    retry_cap: timedelta
    reread_base: timedelta
    reread_cap: timedelta
    unreadable_for: timedelta
    # The action's write_started_at as the claim read it: an earlier attempt's write may exist.
    prior_write: datetime | None = None
    # When the claim took the action: its lease_until minus the lease it asked for.
    claimed_at: datetime | None = None

    @property
    def is_last(self) -> bool:
        return self.number >= self.max_attempts

    @property
    def write_age(self) -> timedelta | None:
        """How long before this attempt's claim the action's write started (its
        ``write_started_at``); None when no earlier attempt's write may exist."""
        if self.prior_write is None or self.claimed_at is None:
            return None
        return max(self.claimed_at - self.prior_write, timedelta(0))

    @property
    def reads_only(self) -> bool:
        """This attempt did not call begin_write() and an earlier attempt's write may exist: it
        only read back, and its Reread counts no attempt (the read window bounds it)."""
        return not self.began_write and self.write_age is not None


def backoff(number: int, base: timedelta, cap: timedelta) -> timedelta:
    """Exponential backoff with full jitter: a random wait in [base/2, min(cap, base*2^(n-1))]."""
    ceiling = min(cap.total_seconds(), base.total_seconds() * (2 ** max(number - 1, 0)))
    floor = min(base.total_seconds() / 2, ceiling)
    return timedelta(seconds=random.uniform(floor, ceiling))


def reread_backoff(waited: timedelta, base: timedelta, cap: timedelta) -> timedelta:
    """The wait the core picks after a Reread without its own ``after``: a random wait between
    half of and all of the time the action has waited on reads so far, never below ``base`` nor
    above ``cap``. Each read about doubles the time waited, so the reads thin out as an outage
    lasts (with 1 s and 2 min: reads about 1, 2, 3.5, 6, 11, 19 s after the write, then
    every 1-2 min, 17 to 21 reads in 15 minutes: docs/concepts.md, "Reading back"),
    and actions whose answers were lost together do not read back in step."""
    ceiling = min(cap, max(base, waited))
    floor = max(base, ceiling / 2)
    return timedelta(seconds=random.uniform(floor.total_seconds(), ceiling.total_seconds()))


def reread_wait(facts: AttemptFacts, after: timedelta | None) -> timedelta:
    """How long the lease of a Reread that does not end the action runs: the adapter's own
    ``after``, or the core's growing wait; for an attempt that only read, cut so that the next
    read comes no later than the end of the kind's ``unreadable_for``."""
    age = facts.write_age
    if after is None:
        after = reread_backoff(age or timedelta(0), facts.reread_base, facts.reread_cap)
    if age is not None and facts.reads_only:
        after = min(after, facts.unreadable_for - age)
    return after


# Control characters (C0, DEL, C1) and the line and paragraph separators: a detail is one line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def clean_detail(text: str | None) -> str | None:
    """A result's detail as the action keeps it: one line, control characters replaced by
    spaces, at most DETAIL_LIMIT characters (a longer one cut, ending in an ellipsis); None for
    None or a text with nothing left."""
    if text is None:
        return None
    line = " ".join(_CONTROL.sub(" ", text).split())
    if len(line) > DETAIL_LIMIT:
        line = line[: DETAIL_LIMIT - 1].rstrip() + "\u2026"
    return line or None


def decide(facts: AttemptFacts, result: AdapterResult | BaseException) -> Ending | None:
    """The write for this result; None for Abandoned (another holder owns the action)."""
    if isinstance(result, Done):
        # First and without the partial or the pattern matching below: most attempts end
        # here (0.8 against 2.1 us).
        return Ending(
            facts.action_id,
            facts.kind,
            facts.lane_key,
            facts.epoch,
            ActionState.EXECUTING,
            ActionState.DONE,
            "Done",
            StopReason.COMPLETED,
            result.readback_ref,
            detail=None if result.detail is None else clean_detail(result.detail),
        )
    detail: str | None
    if isinstance(result, BaseException):
        # The exception's type only: its message may quote the payload or the provider's
        # answer to it.
        detail = f"raised {type(result).__name__}"
        result = exception_result(facts)
    else:
        detail = clean_detail(result.detail)
        if detail is None and isinstance(result, Retry):
            detail = clean_detail(result.why)
    ending = functools.partial(
        Ending,
        facts.action_id,
        facts.kind,
        facts.lane_key,
        facts.epoch,
        ActionState.EXECUTING,
        detail=detail,
    )
    match result:
        case Retry(after=after):
            if facts.is_last:
                return ending(
                    ActionState.FAILED, "Retry", stop_reason=StopReason.ATTEMPTS_EXHAUSTED
                )
            wait = (
                after
                if after is not None
                else backoff(facts.number, facts.retry_base, facts.retry_cap)
            )
            return ending(ActionState.ADMITTED, "Retry", delay=wait, fence="clear")
        case Defer(after=after, event=event):
            return ending(
                ActionState.ADMITTED,
                "Defer",
                delay=after,
                fence="restore",
                uncount=1,
                event=event,
                prior_write=facts.prior_write,
            )
        case Reread(after=after):
            if facts.at_most_once:
                # A kind that cannot read back has nothing to reread: the effect may exist.
                return ending(
                    ActionState.UNCERTAIN, "Reread", stop_reason=StopReason.WRITE_UNCONFIRMED
                )
            # Writes are bounded by attempts, reads by time.
            if not facts.reads_only:
                if facts.is_last:
                    return ending(
                        ActionState.UNCERTAIN, "Reread", stop_reason=StopReason.ATTEMPTS_EXHAUSTED
                    )
                return ending(ActionState.EXECUTING, "Reread", delay=reread_wait(facts, after))
            if facts.write_age is not None and facts.write_age >= facts.unreadable_for:
                return ending(
                    ActionState.UNCERTAIN, "Reread", stop_reason=StopReason.READBACK_UNAVAILABLE
                )
            # An attempt that only read counts none, as a Defer.
            return ending(
                ActionState.EXECUTING, "Reread", delay=reread_wait(facts, after), uncount=1
            )
        case Uncertain(reason=reason):
            return ending(ActionState.UNCERTAIN, "Uncertain", stop_reason=reason)
        case Failed(reason=reason):
            return ending(ActionState.FAILED, "Failed", stop_reason=reason)
        case Cancelled(reason=reason):
            return ending(ActionState.CANCELLED, "Cancelled", stop_reason=reason)
        case Abandoned():
            return None
    # The executor checks results first (wrong_result); the type only, never the value.
    raise TypeError(f"an adapter returned {type(result).__qualname__}, not an AdapterResult")


def wrong_result(result: object) -> str | None:
    """What is wrong with what ``execute()`` returned; None for a well-formed result. Names
    types only, never values: a result may carry text from the payload or the provider."""
    if (
        type(result) is Done
        and (result.readback_ref is None or type(result.readback_ref) is str)
        and result.detail is None
    ):
        return None  # most results, without the pattern matching below
    detail = getattr(result, "detail", None)
    if detail is not None and not isinstance(detail, str):
        return _wrong_field(f"{type(result).__name__}.detail", detail, (str,), optional=True)
    match result:
        case Done(readback_ref=ref):
            return _wrong_field("Done.readback_ref", ref, (str,), optional=True)
        case Retry(after=after, why=why):
            return _wrong_field("Retry.after", after, (timedelta,), optional=True) or (
                _wrong_field("Retry.why", why, (str,), optional=True)
            )
        case Defer(after=after, event=event):
            return _wrong_field("Defer.after", after, (timedelta,)) or (
                _wrong_field("Defer.event", event, (str,), optional=True)
            )
        case Reread(after=after):
            return _wrong_field("Reread.after", after, (timedelta,), optional=True)
        case Uncertain(reason=reason) | Failed(reason=reason) | Cancelled(reason=reason):
            return _wrong_field(f"{type(result).__name__}.reason", reason, (str,))
        case Abandoned():
            return None
    hint = " (a missing return?)" if result is None else ""
    return (
        f"execute() returned {type(result).__qualname__}{hint}, not an AdapterResult: return "
        "Done, Retry, Defer, Reread, Uncertain, Failed, Cancelled or Abandoned"
    )


def _wrong_field(
    name: str, value: object, types: tuple[type, ...], *, optional: bool = False
) -> str | None:
    if isinstance(value, types) or (optional and value is None):
        return None
    result, field = name.split(".")
    wanted = " or ".join(t.__name__ for t in types) + (" or None" if optional else "")
    return (
        f"execute() returned {result} whose {field} is {type(value).__qualname__}; "
        f"it must be {wanted}"
    )


def exception_result(facts: AttemptFacts) -> AdapterResult:
    """An exception counts as Retry before the fence; after it, Reread for a kind that reads
    back and Uncertain for an at-most-once kind.

    The fence is the action's, not only this attempt's: an attempt that inherits an earlier
    attempt's write (``prior_write``) and raises, say while reading that write back, is after
    the fence. A Retry there would clear the fence, so the next attempt would not read back
    and would write the effect a second time."""
    if not facts.fenced and facts.prior_write is None:
        return Retry()
    if facts.at_most_once:
        return Uncertain(StopReason.WRITE_UNCONFIRMED)
    return Reread()
