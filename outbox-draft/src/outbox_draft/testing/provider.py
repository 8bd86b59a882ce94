"""The loopback model server as the core's adapter conformance suite steers it.

``DRAFT_REPORT`` writes nothing outside the database, so the suite checks it in that profile
(no fence, a repeated call harmless): ``writes(request)`` counts the completions the server
served for the request's report, ``fault("refuse")`` answers a 503 (the server holds nothing),
``fault("drop")`` closes the connection after the request arrived, and ``fault("stall")``
answers nothing until the adapter's own timeout ends the call::

    class TestDraftConforms(AdapterConformance):
        @pytest.fixture
        def conformance_target(self, outbox_db, model_server):
            return conformance_target(outbox_db, model_server)

Each suite request gets a report of its own (stored with its filing first, committed), whose
id holds the suite's canary and stands in its text: the text is what reaches the server, and
no log record may repeat the canary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from outbox_core import ActionRequest
from outbox_issues.domain import lane, queries
from outbox_issues.testing.provider import WORKSPACE, store_report

from ..adapter import DRAFT_REPORT
from .server import ModelTestServer

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase
    from outbox_core.testing.conformance import Fault


class DraftProvider:
    """``requests()``, ``writes(request)``, ``fault(fault)``, ``clear_faults()`` over a
    :class:`ModelTestServer`, and the suite's request factory (:meth:`request`)."""

    def __init__(self, server: ModelTestServer) -> None:
        self.server = server

    def requests(self) -> int:
        with self.server.lock:
            return len(self.server.requests)

    def writes(self, request: ActionRequest) -> int:
        payload = request.payload
        report = str(
            payload["report"] if isinstance(payload, Mapping) else payload.model_dump()["report"]
        )
        with self.server.lock:
            return sum(1 for served in self.server.served if report in served.user_text)

    def fault(self, fault: Fault) -> None:
        match fault:
            case "refuse":
                self.server.server_error(503)
            case "drop":
                self.server.drop()
            case "stall":
                self.server.stall()

    def clear_faults(self) -> None:
        self.server.clear()

    def request(self, db: OutboxTestDatabase, key: str, canary: str) -> ActionRequest:
        """A valid ``DRAFT_REPORT`` with idempotency key ``key``, for a report of its own whose
        id holds ``canary`` (stored with its filing first, committed)."""
        report = f"{canary}.{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        with db.connect() as conn:
            store_report(
                conn,
                queries(db.schema),
                report,
                f"Conformance report {canary}",
                f"The export does nothing ({report}).",
            )
        return ActionRequest(
            kind=DRAFT_REPORT,
            lane_key=lane(report),
            idempotency_key=key,
            payload={"report": report, "generation": 1},
            workspace_id=WORKSPACE,
        )
