"""What a failed call to an HTTP provider proves, and the result it becomes, in one place for
every HTTP adapter (outbox-issues' tracker, outbox-draft's model proxy). An adapter says what
happened as an :class:`HttpFailure`; :func:`http_result` maps it:

=================================================  ==========================================
what happened                                      result
=================================================  ==========================================
``NOT_SENT``: the connection never stood           Retry; Reread when an earlier attempt
(refused, connect timeout, no pool slot)           may have written (a Retry would let the
                                                   next attempt write without reading back)
``UNANSWERED``: sent, and no usable answer (a      Reread when the call (or an earlier one)
timeout, a dropped connection, a 5xx, a 2xx        may have written; else Retry, after the
whose body is not what the API documents)          provider's ``Retry-After`` if it sent one
``LIMITED``: a 429, or a rate limit the provider   Defer for the wait it named
names in another answer (GitHub's 403 with         (``Retry-After``, a rate-limit reset:
``x-ratelimit-remaining: 0``)                      ``http_headers``), else the kind's
                                                   default; no attempt spent
``REFUSED``: any other 3xx or 4xx                  Failed, the kind's reason for the status
                                                   (``GITHUB_404``; ``REFUSED`` by default)
=================================================  ==========================================

Each result carries the failure's ``detail`` (the status and the provider's words about the
failure, never what was sent). What a package reads differently stays in the package: which
answers are a rate limit (GitHub's secondary limits, in their message), which 429 is the
proxy's own capacity (LiteLLM's wordings), which refusal names the content sent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from .results import AdapterResult, Defer, Failed, Reread, Retry, StopReason

__all__ = ["DEFAULT_LIMIT_WAIT", "HttpFailure", "Proof", "http_result"]

DEFAULT_LIMIT_WAIT = timedelta(minutes=1)
"""A rate limit's wait when the provider names none."""


class Proof(enum.Enum):
    """What a failed call proves about the request (the rows of this module's table)."""

    NOT_SENT = "not sent"
    UNANSWERED = "unanswered"
    LIMITED = "limited"
    REFUSED = "refused"

    @classmethod
    def of_status(cls, status: int) -> Proof:
        """What an answer's status proves by itself: 429 a rate limit, a 5xx or a 2xx (an
        answer the caller could not use) no answer, any other status a refusal."""
        if status == 429:
            return cls.LIMITED
        if status >= 500 or 200 <= status < 300:
            return cls.UNANSWERED
        return cls.REFUSED


@dataclass(frozen=True, slots=True)
class HttpFailure:
    """One failed call: what it proves, its ``detail`` (what the action keeps), the answer's
    status when one came, and the wait the provider asked for (``Retry-After``, a rate-limit
    reset)."""

    proof: Proof
    detail: str
    status: int | None = None
    wait: timedelta | None = None

    @classmethod
    def of_answer(cls, status: int, detail: str, *, wait: timedelta | None = None) -> HttpFailure:
        """The failure an answer proves by its status alone (:meth:`Proof.of_status`)."""
        return cls(Proof.of_status(status), detail, status=status, wait=wait)


def http_result(
    failure: HttpFailure,
    *,
    may_have_written: bool = False,
    refused_reason: Callable[[int], str] | None = None,
    default_wait: timedelta = DEFAULT_LIMIT_WAIT,
) -> AdapterResult:
    """The result ``failure`` proves (this module's table).

    ``may_have_written``: this call sent a write, or an earlier attempt of the action may have
    (only a kind that reads back passes True: it looks for the write before writing again).
    ``refused_reason``: the stop reason of a refusal, from its status (unset, or a refusal
    without a status: ``REFUSED``). ``default_wait``: a
    rate limit's wait when the provider named none."""
    match failure.proof:
        case Proof.LIMITED:
            wait = failure.wait if failure.wait is not None else default_wait
            return Defer(wait, detail=f"{failure.detail}, waiting {wait.total_seconds():g} s")
        case Proof.REFUSED:
            status = failure.status
            reason = StopReason.REFUSED
            if refused_reason is not None and status is not None:
                reason = refused_reason(status)
            return Failed(reason, detail=failure.detail)
    if may_have_written:
        return Reread(detail=failure.detail)
    return Retry(after=failure.wait, detail=failure.detail)
