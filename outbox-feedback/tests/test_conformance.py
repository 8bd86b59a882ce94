"""The three feedback kinds pass the core's adapter conformance suite, as read-back kinds,
against the loopback tracker (``outbox_feedback.testing.FeedbackProvider``): each suite request
has a feedback of its own on a pull request of its own (its id holds the suite's canary)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget
from outbox_feedback import DELIVER_FEEDBACK, EDIT_FEEDBACK, RETRACT_FEEDBACK
from outbox_feedback.testing import conformance_target
from outbox_issues.testing import GitHubTestServer


class FeedbackKindConformance(AdapterConformance):
    """The suite for one kind (``kind``); not collected by itself."""

    kind: ClassVar[str]

    @pytest.fixture
    def conformance_target(
        self, outbox_db: OutboxTestDatabase, tracker_server: GitHubTestServer
    ) -> ConformanceTarget:
        return conformance_target(outbox_db, tracker_server, self.kind)


class TestDeliverFeedbackConforms(FeedbackKindConformance):
    kind = DELIVER_FEEDBACK


class TestEditFeedbackConforms(FeedbackKindConformance):
    kind = EDIT_FEEDBACK


class TestRetractFeedbackConforms(FeedbackKindConformance):
    kind = RETRACT_FEEDBACK
