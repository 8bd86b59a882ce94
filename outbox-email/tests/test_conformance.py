"""EMAIL passes the core's adapter conformance suite, as an at-most-once kind, against the
loopback SMTP relay."""

from __future__ import annotations

import pytest

from outbox_core import ActionRequest
from outbox_core.testing import OutboxTestDatabase
from outbox_core.testing.conformance import AdapterConformance, ConformanceTarget
from outbox_email.adapter import KIND
from outbox_email.testing import SmtpProvider, SmtpTestServer

from . import notices


class TestEmailConforms(AdapterConformance):
    @pytest.fixture
    def conformance_target(
        self,
        email_db: OutboxTestDatabase,
        smtp_server: SmtpTestServer,
        directory: dict[str, notices.Person],
    ) -> ConformanceTarget:
        def request(key: str, canary: str) -> ActionRequest:
            # The canary is the account: the notice finds its address in the directory.
            directory[canary] = notices.Person("Conformance", "conformance@example.test")
            payload = {"notice": "welcome", "event": {"account_id": canary}}
            return ActionRequest(KIND, "conformance", key, payload=payload)

        return ConformanceTarget(
            db=email_db, kind=KIND, provider=SmtpProvider(smtp_server), request=request
        )
