"""The outbox plugin of outbox-draft (entry point ``draft`` in ``outbox_core.plugins``).

Only ``@hookimpl`` functions, cheap to import: httpx is imported when the executor builds the
adapter. It registers ``DRAFT_REPORT`` and its migration line, and answers outbox-issues' draft
hook (``outbox_issues.hookspecs``), which ``submit_report`` and ``edit_report`` call.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox_core import ActionAdapter, ActionRequest, MigrationLine, Outbox, hookimpl
from outbox_issues.hookspecs import DraftContext, NoDraft

from .adapter import DraftReportAdapter
from .enqueue import draft_request


@hookimpl
def outbox_register_kinds(register: Callable[[type[ActionAdapter]], None]) -> None:
    register(DraftReportAdapter)


@hookimpl
def outbox_register_migrations(register: Callable[[MigrationLine], None]) -> None:
    register(MigrationLine("draft", "outbox_draft", "migrations"))


@hookimpl
def outbox_issues_draft_request(
    draft: DraftContext, outbox: Outbox
) -> ActionRequest | NoDraft | None:
    return draft_request(draft, outbox)
