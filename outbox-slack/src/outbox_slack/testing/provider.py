"""The loopback Slack server as the core's adapter conformance suite steers it.

The suite (``outbox_core.testing.conformance``) reads a provider through four methods;
:class:`SlackProvider` gives them over a :class:`SlackTestServer`, and
:func:`conformance_request` makes the suite's requests (the turn and its entry stored first,
as ``post_turn`` would)::

    class TestSlackConformance(AdapterConformance):
        @pytest.fixture
        def conformance_target(self, outbox_db, slack_server):
            serve_slack(outbox_db, slack_server, readback_window_seconds=0)
            return ConformanceTarget(
                db=outbox_db,
                kind="SLACK_POST",
                provider=SlackProvider(slack_server),
                request=lambda key, canary: conformance_request(outbox_db, key, canary),
            )
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from outbox_core import ActionRequest
from outbox_core.testing.conformance import Fault

from ..adapter import KIND, SlackPost, lane_key
from ..domain import queries
from .server import SlackTestServer

if TYPE_CHECKING:
    from outbox_core.testing import OutboxTestDatabase

CHANNEL = "C0TEST"


class SlackProvider:
    """``requests()``, ``writes(request)``, ``fault(fault)``, ``clear_faults()`` over a server.

    - ``refuse``: ``{"ok": false, "error": "service_unavailable"}``, nothing recorded (Slack
      says it did not carry the post out: the adapter retries);
    - ``drop``: the post is recorded, then the connection closed before the answer;
    - ``stall``: the post is recorded, then the answer never comes (the adapter's
      ``request_timeout_seconds`` must end the call);
    - ``unreadable``: until :meth:`clear_faults`, every read-back call (``auth.test``,
      ``conversations.history``, ``conversations.replies``) answers HTTP 503 (an outage)."""

    def __init__(self, server: SlackTestServer) -> None:
        self.server = server

    def requests(self) -> int:
        return sum(self.server.requests.values())

    def writes(self, request: ActionRequest) -> int:
        return len(self.server.posts_for(request.idempotency_key))

    def fault(self, fault: Fault) -> None:
        match fault:
            case "refuse":
                self.server.fail("chat.postMessage", "service_unavailable")
            case "drop":
                self.server.drop_after_recording("chat.postMessage")
            case "stall":
                self.server.stall("chat.postMessage", after_recording=True)
            case "unreadable":
                self.server.outage(math.inf)

    def clear_faults(self) -> None:
        self.server.clear_faults()


def conformance_request(
    db: OutboxTestDatabase, key: str, canary: str, *, channel: str = CHANNEL
) -> ActionRequest:
    """A valid ``SLACK_POST`` request with idempotency key ``key`` and ``canary`` in its payload
    (the turn's id): its turn and one entry are stored (committed) first, as ``post_turn``
    stores them, since the adapter reads the entry's text from the database."""
    sql = queries(db.schema)
    turn = {
        "turn_id": canary,
        "workspace_id": "W1",
        "channel": channel,
        "thread_ts": None,
        "subject": None,
        "key": key,
    }
    entry = f"{canary}-entry"
    with db.connect() as conn:
        # The suite may ask twice for one key's request: store the turn once.
        if conn.execute(sql["insert_turn"], turn).fetchone() is not None:
            conn.execute(
                sql["insert_entries"],
                {
                    "turn_id": canary,
                    "ids": [entry],
                    "kinds": ["question"],
                    "positions": [0],
                    "channels": [channel],
                    "texts": ["a conformance post"],
                },
            )
    return ActionRequest(
        kind=KIND,
        lane_key=lane_key(channel, None),
        idempotency_key=key,
        payload=SlackPost(turn_id=canary, entry_ids=[entry]),
        workspace_id="W1",
    )
