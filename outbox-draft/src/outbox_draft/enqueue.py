"""The draft that ``outbox-issues`` asks for: :func:`draft_request` answers its hook
``outbox_issues_draft_request`` when ``submit_report`` (or a re-draft, ``edit_report``) runs, in
the application's transaction and before anything is written.

The draft runs in the report's lane, ``file_issue:<report>``, ahead of the filing (or the
publish) of its generation, with the key ``draft:<report>:<generation>``, three attempts, and
an expiry ten minutes after it is enqueued (by this host's clock; the executor compares it with
the database's). What cannot be drafted is refused here with a clear error and nothing is
written: an empty text, a text longer than ``max_report_chars`` or too long for the model's
``context_tokens`` (:func:`~outbox_draft.draftable.check_draftable`), settings that cannot be
read. Without a model configured, no draft is made and the result says why (:class:`NoDraft`);
the issue is then filed with the report's own text. Nothing here calls the network.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbox_core import ActionRequest, Outbox
from outbox_issues.hookspecs import DraftContext, NoDraft

from .adapter import DRAFT_REPORT, DraftReportAdapter
from .draftable import check_draftable
from .settings import DraftSettings

MAX_ATTEMPTS = 3
EXPIRES_AFTER = timedelta(minutes=10)


def draft_key(report_id: str, generation: int) -> str:
    return f"draft:{report_id}:{generation}"


def served_settings(outbox: Outbox) -> DraftSettings | None:
    """The settings of ``DRAFT_REPORT`` as ``outbox`` serves it (a class bound to settings, as
    a test or the application registered it, else the environment); None when the kind is not
    registered (its plugin blocked)."""
    if DRAFT_REPORT not in outbox.registry:
        return None
    adapter = outbox.registry.get(DRAFT_REPORT).adapter
    if isinstance(adapter, type) and issubclass(adapter, DraftReportAdapter):
        return adapter.section_settings()
    return DraftSettings.load()


def draft_request(draft: DraftContext, outbox: Outbox) -> ActionRequest | NoDraft | None:
    """The ``DRAFT_REPORT`` of this generation, or why none is made (no model configured)."""
    settings = served_settings(outbox)
    if settings is None:
        return None
    if settings.missing:
        return NoDraft(
            f"no draft: {' and '.join(settings.missing)} unset; the issue uses the report's "
            "own text"
        )
    check_draftable(draft.text, settings)
    return ActionRequest(
        kind=DRAFT_REPORT,
        lane_key=draft.lane_key,
        idempotency_key=draft_key(draft.report_id, draft.generation),
        payload={"report": draft.report_id, "generation": draft.generation},
        workspace_id=draft.workspace_id,
        max_attempts=MAX_ATTEMPTS,
        expires_at=datetime.now(UTC) + EXPIRES_AFTER,
    )
