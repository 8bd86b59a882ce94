"""Test ``DRAFT_REPORT`` against a real HTTP server on loopback that speaks OpenAI's chat
completions API.

- :class:`ModelTestServer`: chat completions with the real response shape (usage counts
  included) and the real error bodies (OpenAI's and LiteLLM's), recording every request, told
  to answer a canned text, refuse for capacity (429), pass on an upstream rate limit (429),
  fail with a 5xx, stall, drop the connection, or not know the model (404, 400).
- :func:`serve_draft`: point ``DRAFT_REPORT`` in an ``outbox_db`` test database at that server.
- :class:`DraftProvider` and :func:`conformance_target`: the server as the core's adapter
  conformance suite (``outbox_core.testing.conformance``) steers it.
- The pytest fixture ``model_server`` (loaded with the package's ``pytest11`` entry point).

Only the standard library: ``pip install outbox-draft`` is enough.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..adapter import DRAFT_REPORT, DraftReportAdapter
from .provider import DraftProvider
from .server import API_KEY, CANNED, MODEL, Behaviour, ModelTestServer, Recorded

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase
    from outbox_core.testing.conformance import ConformanceTarget

__all__ = [
    "API_KEY",
    "CANNED",
    "MODEL",
    "Behaviour",
    "DraftProvider",
    "ModelTestServer",
    "Recorded",
    "conformance_target",
    "serve_draft",
]


def serve_draft(
    db: OutboxTestDatabase, server: ModelTestServer, **settings: Any
) -> type[DraftReportAdapter]:
    """Make ``DRAFT_REPORT`` in this test's database talk to ``server`` (``settings`` override
    the server's defaults, e.g. ``max_in_flight_total=1``). Returns the class now registered."""
    bound = DraftReportAdapter.bind(settings=server.settings(**settings))
    return db.replace_adapter(bound, distribution="outbox-draft")


def conformance_target(db: OutboxTestDatabase, server: ModelTestServer) -> ConformanceTarget:
    """The suite's target: ``DRAFT_REPORT`` in ``db`` served by ``server``."""
    from outbox_core.testing.conformance import ConformanceTarget

    serve_draft(db, server)
    provider = DraftProvider(server)
    return ConformanceTarget.of(db, DRAFT_REPORT, provider)
