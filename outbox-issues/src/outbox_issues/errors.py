"""The errors outbox-issues raises on purpose. Each message says what was wrong and what to do."""

from __future__ import annotations

from outbox_core import InvalidRequest


class UnknownReport(InvalidRequest):
    """No report of this id was submitted."""


class NotFiled(InvalidRequest):
    """The report's filing is not FILED, so the action asked for cannot run yet (or ever)."""


class ReportErased(InvalidRequest):
    """The reporter was erased: the report's text is gone."""


class NotConfigured(InvalidRequest):
    """The settings lack what the action needs (a private repository for Make private)."""
