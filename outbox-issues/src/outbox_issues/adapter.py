"""The adapters of ``FILE_ISSUE``, ``PUBLISH_REPORT``, ``CLEANUP_ISSUE`` and ``TRANSFER_ISSUE``:
the only code that calls the issue tracker (through :class:`~outbox_issues.tracker.GitHubTracker`).

All four read back: every write carries a marker naming the action (a hidden HTML comment with
its idempotency key), so an attempt after an unknown write finds that write before it writes
again. A tracker answer becomes a result in one place, :func:`result_for` (its table is in
:mod:`.tracker_results`).


``FILE_ISSUE`` after an unknown write (``attempt.write_started``) lists the repository's issues
created by the identity the token writes as, ``state=all``, updated since the write's time
minus a skew margin, every page (never the search API: it is eventually consistent), and looks
for its marker. Found: Done. Listed completely at least ``listing_lag_seconds`` (2 minutes)
after the latest write, and absent: it writes again behind a new fence. Listed completely but
sooner: Reread after the lag that is left (a new issue can be missing from listings for a
while). The listing fails (a 5xx, a dropped connection, a timeout): Reread with what it saw.

Read-backs follow the core's rule (``Reread`` in ``outbox_core.results``): a Reread from an
attempt that wrote counts an attempt (UNCERTAIN ``ATTEMPTS_EXHAUSTED`` at the last); one from an
attempt that only read counts none, the core choosing the growing wait, until GitHub has been
unreadable for the kind's ``unreadable_for`` (15 minutes) since the write started: then
UNCERTAIN ``READBACK_UNAVAILABLE``. Every Reread, Defer and Failed says in its detail what the
attempt saw (``HTTP 503 Service Unavailable``, ``listing lag: ...``, ``not configured: ...``).

``PUBLISH_REPORT`` reads the issue first and compares its content marker (generation and
digest): equal is Done without a write. ``TRANSFER_ISSUE`` reads back by the issue's node id
through GraphQL (a transferred issue keeps its node id; its old REST URL answers 301).
``CLEANUP_ISSUE`` scrubs (or deletes) an issue found by number or by its filing's marker.

The client never retries a request on its own: an HTTP layer that sends a POST again could
file a second issue.

The kinds live one module per pair: :mod:`.adapter_base` (what the four share),
:mod:`.adapters_file_publish`, :mod:`.adapters_transfer_cleanup`. Every name is importable
from here, as before.
"""

from __future__ import annotations

from .adapter_base import (
    CLEANUP_ISSUE,
    FILE_ISSUE,
    KINDS,
    PUBLISH_REPORT,
    TRANSFER_ISSUE,
    Facts,
    GenerationPayload,
    ReportPayload,
    TrackerAdapter,
    content_of,
    issue_location,
    report_of,
)
from .adapters_file_publish import FileIssueAdapter, IssueContentCheck, PublishReportAdapter
from .adapters_transfer_cleanup import (
    DELETED,
    SCRUBBED,
    CleanupIssueAdapter,
    TransferIssueAdapter,
    in_history,
)
from .settings import IssuesSettings
from .tracker_results import (
    CONTENT_REFUSED,
    GRAPHQL_ERROR,
    GRAPHQL_REASONS,
    NO_FILING,
    NOT_FILED,
    REFUSED_STATUSES,
    REPORT_ERASED,
    STOP_REASONS,
    UNKNOWN_REPORT,
    listing_lag,
    refused_content,
    refused_reason,
    result_for,
)

__all__ = [
    "ADAPTERS",
    "CLEANUP_ISSUE",
    "CONTENT_REFUSED",
    "DELETED",
    "FILE_ISSUE",
    "GRAPHQL_ERROR",
    "GRAPHQL_REASONS",
    "KINDS",
    "NOT_FILED",
    "NO_FILING",
    "PUBLISH_REPORT",
    "REFUSED_STATUSES",
    "REPORT_ERASED",
    "SCRUBBED",
    "STOP_REASONS",
    "TRANSFER_ISSUE",
    "UNKNOWN_REPORT",
    "CleanupIssueAdapter",
    "Facts",
    "FileIssueAdapter",
    "GenerationPayload",
    "IssueContentCheck",
    "PublishReportAdapter",
    "ReportPayload",
    "TrackerAdapter",
    "TransferIssueAdapter",
    "bind_all",
    "content_of",
    "in_history",
    "issue_location",
    "listing_lag",
    "refused_content",
    "refused_reason",
    "report_of",
    "result_for",
]


ADAPTERS: tuple[type[TrackerAdapter], ...] = (
    FileIssueAdapter,
    PublishReportAdapter,
    CleanupIssueAdapter,
    TransferIssueAdapter,
)


def bind_all(settings: IssuesSettings) -> list[type[TrackerAdapter]]:
    """The four adapter classes bound to ``settings``."""
    return [adapter.bind(settings) for adapter in ADAPTERS]
