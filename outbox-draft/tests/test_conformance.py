"""DRAFT_REPORT passes the core's adapter conformance suite in its profile for kinds that write
nothing outside (no fence, a repeated call harmless), against the loopback model server."""

from __future__ import annotations

import pytest

from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget, Profile
from outbox_draft import DraftReportAdapter
from outbox_draft.testing import ModelTestServer, conformance_target


def test_the_suite_checks_draft_report_as_a_kind_that_writes_nothing_outside() -> None:
    assert Profile.of(DraftReportAdapter) is Profile.NOTHING_OUTSIDE


class TestDraftReportConforms(AdapterConformance):
    @pytest.fixture
    def conformance_target(
        self, outbox_db: OutboxTestDatabase, model_server: ModelTestServer
    ) -> ConformanceTarget:
        return conformance_target(outbox_db, model_server)
