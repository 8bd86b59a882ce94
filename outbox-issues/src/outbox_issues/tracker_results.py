"""What a tracker answer becomes, in one place (:func:`result_for`), and the stop reasons of
the issue kinds (``outbox-feedback`` adds its own to these). The rows that any HTTP provider
shares (never sent, unanswered, a rate limit, a refusal) are the core's mapping
(``outbox_core.http_results``); what is GitHub's own stays here (which answers are a rate
limit, a 422 refusing the content, GraphQL's errors):

=========================================================  ===================================
what happened                                              result
=========================================================  ===================================
2xx                                                        Done, ``readback_ref`` = the
                                                           issue's URL
connection refused, connect timeout: the request never     Retry (Reread when an earlier
left                                                       attempt may have written)
primary rate limit: 403 or 429 with                        Defer until ``x-ratelimit-reset``
``x-ratelimit-remaining: 0``; GraphQL ``RATE_LIMITED``     (the tracker's clock, its ``Date``)
secondary rate limit: 403 or 429 whose message says so,    Defer for ``retry-after``, at least
or with ``retry-after``                                    a minute without it
a 422 refusing the title or the body we sent (checked at   Failed, ``CONTENT_REFUSED`` (its
enqueue, refused all the same: a limit not known here)     fields in the detail; logged ERROR)
any other 403; 401; 404 and 410 on the repository; any     Failed, ``GITHUB_<status>``
other 422, 4xx or 3xx
GraphQL ``errors`` (HTTP 200) of another type              Failed, ``GRAPHQL_NOT_FOUND``,
                                                           ``GRAPHQL_FORBIDDEN`` or
                                                           ``GRAPHQL_ERROR``; never Done
a timeout, a dropped connection after the request was      Reread after the write (Retry
sent, a 5xx, a 2xx body that is not what the API           before any write of the action)
documents
"""

from __future__ import annotations

from datetime import timedelta

from outbox_core import (
    AdapterResult,
    Failed,
    Reread,
)
from outbox_core.http_results import http_result

from .tracker import (
    GraphQLRefused,
    Refused,
    TrackerError,
    said,
)

NOT_FILED = "NOT_FILED"
REPORT_ERASED = "REPORT_ERASED"
UNKNOWN_REPORT = "UNKNOWN_REPORT"
GRAPHQL_REASONS = {
    "NOT_FOUND": "GRAPHQL_NOT_FOUND",
    "FORBIDDEN": "GRAPHQL_FORBIDDEN",
}
GRAPHQL_ERROR = "GRAPHQL_ERROR"
CONTENT_REFUSED = "CONTENT_REFUSED"
"""GitHub refused what was written (422 on the title, the body): nothing was written. A
filing stopped so can be filed again by ``edit_report`` with content that fits."""
_CONTENT_FIELDS = frozenset({"title", "body", "data"})  # "data": an issue comment's body
REFUSED_STATUSES = (*range(300, 400), *range(400, 500))
DELETED, SCRUBBED = "#deleted", "#scrubbed"


NO_FILING = "no filing of this report"


def listing_lag(wait: timedelta) -> Reread:
    """A write that may still be missing from listings: looked for again once it shows."""
    return Reread(
        after=wait,
        detail=f"listing lag: a write this recent may not be listed yet, again in "
        f"{wait.total_seconds():.0f} s",
    )


def refused_reason(status: int) -> str:
    """The stop reason of a refusal: ``GITHUB_422``."""
    return f"GITHUB_{status}"


STOP_REASONS = frozenset(
    {refused_reason(code) for code in REFUSED_STATUSES}
    | set(GRAPHQL_REASONS.values())
    | {GRAPHQL_ERROR, CONTENT_REFUSED, NOT_FILED, REPORT_ERASED, UNKNOWN_REPORT}
)


def refused_content(error: Refused) -> list[str]:
    """What of the content sent a 422 refuses (``body:custom``, ``title:missing_field``);
    empty for any other refusal."""
    if error.status != 422:
        return []
    return [
        f"{found.get('field')}:{found.get('code')}"
        for found in error.errors
        if isinstance(found, dict) and found.get("field") in _CONTENT_FIELDS
    ]


def _content_detail(error: Refused, fields: list[str]) -> str:
    """``HTTP 422 Validation Failed: body:custom (body is too long (maximum is … characters))``:
    the fields and GitHub's first words about them, never the content."""
    words = next(
        (
            said(str(found["message"]))
            for found in error.errors
            if isinstance(found, dict) and found.get("message")
        ),
        "",
    )
    return f"{error.detail}: {', '.join(fields)}" + (f" ({words})" if words else "")


def result_for(error: TrackerError, *, may_have_written: bool) -> AdapterResult:
    """The result a tracker failure proves (the table in this module's docstring), with the
    failure's detail (``TrackerError.detail``: the HTTP status and the tracker's words).

    ``may_have_written``: this attempt sent a write, or an earlier attempt may have (then a
    Retry, which clears the fence, would let the next attempt write without reading back)."""
    match error:
        case Refused() if refused_content(error):
            return Failed(CONTENT_REFUSED, detail=_content_detail(error, refused_content(error)))
        case GraphQLRefused(types=types):
            for kind in types:
                if kind in GRAPHQL_REASONS:
                    return Failed(GRAPHQL_REASONS[kind], detail=error.detail)
            return Failed(GRAPHQL_ERROR, detail=error.detail)
    # RateLimited (Defer for its wait), any other Refused (GITHUB_<status>), NotSent,
    # Unanswered and any other failure (Reread or Retry): the core's mapping.
    return http_result(
        error.failure, may_have_written=may_have_written, refused_reason=refused_reason
    )
