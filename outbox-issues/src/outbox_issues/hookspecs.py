"""The hook outbox-issues adds. This module is the manual.

The plugin adds these specifications in ``outbox_add_hookspecs``, so another plugin (above all
``outbox-draft``) or the application registered as one can implement them. outbox-issues
never imports outbox-draft: it calls this hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox_core import hookspec

if TYPE_CHECKING:
    from outbox_core import ActionRequest, Outbox


@dataclass(frozen=True, slots=True)
class DraftContext:
    """The report generation a draft is asked for, and where the draft must run."""

    report_id: str
    generation: int
    workspace_id: str
    lane_key: str
    """``file_issue:<report>``: the report's lane. The draft must run in it, so that it ends
    before the filing (or the publish) behind it starts."""
    idempotency_key: str
    """``draft:<report>:<generation>``."""
    text: str | None = None
    """The report's text of this generation: what the draft would send to the model (check its
    size here, before anything is written)."""


@dataclass(frozen=True, slots=True)
class NoDraft:
    """What a draft plugin returns when it makes no draft of this generation on purpose (no
    model configured): the report is filed with its own text, and ``reason`` is told to the
    caller (:attr:`outbox_issues.Submitted.draft_skipped`)."""

    reason: str


@hookspec(firstresult=True)
def outbox_issues_draft_request(
    draft: DraftContext, outbox: Outbox
) -> ActionRequest | NoDraft | None:
    """Return the action that drafts this generation of a report (``DRAFT_REPORT``), a
    :class:`NoDraft` saying why no draft is made, or None (no opinion). The first
    implementation that returns something other than None wins. ``outbox`` is the caller's
    (its registry holds the draft kind as the application registered it, settings included).

    Raise :class:`~outbox_core.InvalidRequest` (with a one-line reason) for a report that
    cannot be drafted (a text too long): the caller then writes nothing. Never call the network
    here: it runs inside the application's transaction.

    Called by :func:`~outbox_issues.submit_report` and :func:`~outbox_issues.edit_report` in
    the application's transaction, under the filing's row lock, before they enqueue
    ``FILE_ISSUE`` or ``PUBLISH_REPORT``. The request must use ``draft.lane_key`` and
    ``draft.idempotency_key`` (anything else raises ``InvalidRequest`` and nothing is written):
    lane order is what makes the filing wait for the draft. Keep the answer on the filing
    with :func:`outbox_issues.domain.keep_answer` (and drop it with ``drop_answer`` when the
    draft did not end DONE) and move the filing with ``draft_claimed``, ``draft_deferred`` and
    ``draft_ended``."""
