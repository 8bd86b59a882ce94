"""The four issue kinds pass the core's adapter conformance suite, as read-back kinds, against
the loopback GitHub (``outbox_issues.testing.IssuesProvider``): each suite request has a report
of its own (its id holds the suite's canary), and for the kinds that change a filed issue, that
issue is filed on the server first."""

from __future__ import annotations

from typing import ClassVar

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget
from outbox_issues.adapter import CLEANUP_ISSUE, FILE_ISSUE, PUBLISH_REPORT, TRANSFER_ISSUE
from outbox_issues.testing import GitHubTestServer, conformance_target


class IssueKindConformance(AdapterConformance):
    """The suite for one kind (``kind``); not collected by itself."""

    kind: ClassVar[str]

    @pytest.fixture
    def conformance_target(
        self, outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
    ) -> ConformanceTarget:
        return conformance_target(outbox_db, tracker_server, self.kind)


class TestFileIssueConforms(IssueKindConformance):
    kind = FILE_ISSUE


class TestPublishReportConforms(IssueKindConformance):
    kind = PUBLISH_REPORT


class TestCleanupIssueConforms(IssueKindConformance):
    kind = CLEANUP_ISSUE


class TestTransferIssueConforms(IssueKindConformance):
    kind = TRANSFER_ISSUE
