"""outbox-issues: product-feedback reports filed, published, scrubbed and made private on a
GitHub-compatible issue tracker.

Store a report with :func:`submit_report` in the transaction that makes it; ``FILE_ISSUE``
files it once that commits. :func:`publish_report` (``/publish``), :func:`edit_report` and
:func:`make_private` carry later changes; an erasure of the reporter scrubs the issue
(``CLEANUP_ISSUE``). :mod:`outbox_issues.tracker` is the tracker client; the loopback tracker
for tests is :mod:`outbox_issues.testing`.
"""

from .adapter import (
    CLEANUP_ISSUE,
    FILE_ISSUE,
    PUBLISH_REPORT,
    TRANSFER_ISSUE,
    CleanupIssueAdapter,
    FileIssueAdapter,
    PublishReportAdapter,
    TransferIssueAdapter,
)
from .domain import Filing, FilingState, aget_filing, get_filing
from .enqueue import (
    Submitted,
    aedit_report,
    amake_private,
    apublish_report,
    asubmit_report,
    edit_report,
    make_private,
    publish_report,
    submit_report,
)
from .errors import NotConfigured, NotFiled, ReportErased, UnknownReport
from .settings import IssuesSettings

__all__ = [
    "CLEANUP_ISSUE",
    "FILE_ISSUE",
    "PUBLISH_REPORT",
    "TRANSFER_ISSUE",
    "CleanupIssueAdapter",
    "FileIssueAdapter",
    "Filing",
    "FilingState",
    "IssuesSettings",
    "NotConfigured",
    "NotFiled",
    "PublishReportAdapter",
    "ReportErased",
    "Submitted",
    "TransferIssueAdapter",
    "UnknownReport",
    "aedit_report",
    "aget_filing",
    "amake_private",
    "apublish_report",
    "asubmit_report",
    "edit_report",
    "get_filing",
    "make_private",
    "publish_report",
    "submit_report",
]
