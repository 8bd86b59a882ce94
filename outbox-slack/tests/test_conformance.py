"""SLACK_POST passes the core's adapter conformance suite, as a read-back kind, against the
loopback Slack Web API."""

from __future__ import annotations

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget
from outbox_slack import KIND
from outbox_slack.testing import SlackProvider, SlackTestServer, conformance_request


class TestSlackPostConforms(AdapterConformance):
    @pytest.fixture
    def conformance_target(
        self, slack_db: OutboxTestDatabase, slack_server: SlackTestServer
    ) -> ConformanceTarget:
        return ConformanceTarget(
            db=slack_db,
            kind=KIND,
            provider=SlackProvider(slack_server),
            request=lambda key, canary: conformance_request(slack_db, key, canary),
        )
